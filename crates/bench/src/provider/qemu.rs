//! QEMU as the anchor: `qemu-storage-daemon` exporting qcow2 volumes over
//! NBD, driven over QMP as libvirt drives it: a volume is a qcow2 file
//! opened with `blockdev-add` and exported with `block-export-add`; a
//! snapshot is external (a new overlay file, `blockdev-snapshot` puts it on
//! top, the old top becomes the snapshot); a clone is a new overlay on a
//! snapshot's file; a compaction streams the volume's backing chain into
//! its top (`block-stream`), so that the top stands alone and the layers
//! below it are closed (their files stay: snapshots and clones read
//! them). Deleting an external snapshot takes a block-commit,
//! and growing a volume conflicts with its NBD export in QEMU 10; both are
//! refused with a message saying so.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use serde_json::{json, Value};

use super::{nbd_probe, Detail, Provider, Stages};

/// How long qemu-storage-daemon may take to open its QMP socket, and to
/// exit after `quit`.
const START_WITHIN: Duration = Duration::from_secs(20);
/// How long one QMP command may take.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(60);
/// Most bytes of one QMP line read: replies here are small.
const MAX_LINE: usize = 1 << 20;

/// A QMP connection: one command at a time, events skipped.
struct Qmp {
    writer: UnixStream,
    reader: BufReader<UnixStream>,
}

impl Qmp {
    fn connect(socket: &Path) -> Result<Qmp, String> {
        let stream =
            UnixStream::connect(socket).map_err(|e| format!("QMP {}: {e}", socket.display()))?;
        stream
            .set_read_timeout(Some(COMMAND_TIMEOUT))
            .map_err(|e| e.to_string())?;
        let mut qmp = Qmp {
            reader: BufReader::new(stream.try_clone().map_err(|e| e.to_string())?),
            writer: stream,
        };
        qmp.line()?; // the greeting
        qmp.execute("qmp_capabilities", json!({}))?;
        Ok(qmp)
    }

    fn line(&mut self) -> Result<Value, String> {
        let mut line = String::new();
        let read = (&mut self.reader)
            .take(MAX_LINE as u64)
            .read_line(&mut line)
            .map_err(|e| format!("QMP read: {e}"))?;
        if read == 0 {
            return Err("qemu-storage-daemon closed its QMP socket".into());
        }
        serde_json::from_str(&line).map_err(|e| format!("QMP sent something not JSON: {e}"))
    }

    /// Runs `command`; its `return`, or its error's description.
    fn execute(&mut self, command: &str, arguments: Value) -> Result<Value, String> {
        let mut message = serde_json::to_vec(&json!({"execute": command, "arguments": arguments}))
            .map_err(|e| e.to_string())?;
        message.push(b'\n');
        self.writer
            .write_all(&message)
            .map_err(|e| format!("QMP write: {e}"))?;
        loop {
            let reply = self.line()?;
            if reply.get("event").is_some() {
                continue;
            }
            if let Some(error) = reply.get("error") {
                return Err(format!(
                    "{command}: {}",
                    error["desc"].as_str().unwrap_or("error")
                ));
            }
            return Ok(reply["return"].clone());
        }
    }
}

/// A volume the provider serves: its layer files' nodes, bottom to top.
struct Volume {
    nodes: Vec<String>,
    files: Vec<PathBuf>,
    export: String,
    /// Held while a snapshot or a compaction changes the layers: two at
    /// once would both build on the same top, and QEMU refuses the
    /// second ("node is used as backing hd") once the first has run.
    changing: Arc<Mutex<()>>,
}

/// qemu-storage-daemon, started in a directory of its own.
pub struct QemuProvider {
    dir: PathBuf,
    nbd: String,
    qmp: Mutex<Qmp>,
    child: Mutex<Option<Child>>,
    volumes: Mutex<HashMap<String, Volume>>,
    /// (volume, snapshot) -> the snapshot's file.
    snapshots: Mutex<HashMap<(String, String), PathBuf>>,
    counter: AtomicU64,
}

impl QemuProvider {
    /// Starts qemu-storage-daemon with its QMP socket and layer files in
    /// `dir` (created) and its NBD server on a free loopback port; its
    /// log in `log`.
    pub fn start(dir: &Path, log: &Path) -> Result<QemuProvider, String> {
        std::fs::create_dir_all(dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        // Absolute: overlays name their backing files by this path.
        let dir = &dir
            .canonicalize()
            .map_err(|e| format!("cannot resolve {}: {e}", dir.display()))?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| format!("no free port for qemu-storage-daemon's NBD server: {e}"))?
            .port();
        let socket = dir.join("qmp.sock");
        let log_file = std::fs::File::create(log)
            .map_err(|e| format!("cannot create {}: {e}", log.display()))?;
        let mut child = Command::new("qemu-storage-daemon")
            .arg("--chardev")
            .arg(format!(
                "socket,path={},server=on,wait=off,id=qmp0",
                socket.display()
            ))
            .args(["--monitor", "chardev=qmp0", "--nbd-server"])
            .arg(format!(
                "addr.type=inet,addr.host=127.0.0.1,addr.port={port}"
            ))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log_file)
            .process_group(0)
            .spawn()
            .map_err(|e| {
                format!(
                    "cannot start qemu-storage-daemon (apt-get install qemu-system-common?): {e}"
                )
            })?;
        let deadline = Instant::now() + START_WITHIN;
        let qmp = loop {
            match Qmp::connect(&socket) {
                Ok(qmp) => break qmp,
                Err(e) if Instant::now() > deadline || matches!(child.try_wait(), Ok(Some(_))) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(format!(
                        "qemu-storage-daemon did not start: {e}; its log is {}",
                        log.display()
                    ));
                }
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        };
        Ok(QemuProvider {
            dir: dir.to_path_buf(),
            nbd: format!("127.0.0.1:{port}"),
            qmp: Mutex::new(qmp),
            child: Mutex::new(Some(child)),
            volumes: Mutex::new(HashMap::new()),
            snapshots: Mutex::new(HashMap::new()),
            counter: AtomicU64::new(0),
        })
    }

    /// The lock that orders the layer changes of `volume`.
    fn changing(&self, volume: &str) -> Result<Arc<Mutex<()>>, String> {
        self.volumes
            .lock()
            .get(volume)
            .map(|v| v.changing.clone())
            .ok_or_else(|| format!("no volume {volume}"))
    }

    fn execute(&self, command: &str, arguments: Value) -> Result<Value, String> {
        self.qmp.lock().execute(command, arguments)
    }

    /// A new layer file (and its node's name), on `backing` if given.
    fn new_layer(
        &self,
        size: u64,
        cluster_size: Option<u64>,
        backing: Option<&Path>,
    ) -> Result<(String, PathBuf), String> {
        let number = self.counter.fetch_add(1, Ordering::SeqCst);
        let file = self.dir.join(format!("layer-{number}.qcow2"));
        let mut command = Command::new("qemu-img");
        command.args(["create", "-q", "-f", "qcow2"]);
        if let Some(cluster_size) = cluster_size {
            command.args(["-o", &format!("cluster_size={cluster_size}")]);
        }
        if let Some(backing) = backing {
            command.args(["-F", "qcow2", "-b"]).arg(backing);
        }
        let out = command
            .arg(&file)
            .arg(size.to_string())
            .output()
            .map_err(|e| format!("cannot run qemu-img: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "qemu-img create: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok((format!("n{number}"), file))
    }

    /// Opens `file` as node `node` (its backing chain too, unless `bare`).
    fn open(&self, node: &str, file: &Path, bare: bool) -> Result<(), String> {
        let mut arguments = json!({"driver": "qcow2", "node-name": node, "file": {"driver": "file", "filename": file}});
        if bare {
            arguments["backing"] = Value::Null;
        }
        self.execute("blockdev-add", arguments).map(|_| ())
    }

    /// Makes a volume from a new layer (on `backing`) and exports it.
    fn serve(
        &self,
        name: &str,
        size: u64,
        cluster_size: Option<u64>,
        backing: Option<&Path>,
        stages: &mut Stages,
    ) -> Result<Detail, String> {
        let (node, file) = self.new_layer(size, cluster_size, backing)?;
        self.open(&node, &file, false)?;
        let export = format!("e{node}");
        self.execute(
            "block-export-add",
            json!({"type": "nbd", "id": export, "node-name": node, "name": name, "writable": true}),
        )?;
        stages.mark("created");
        self.volumes.lock().insert(
            name.to_string(),
            Volume {
                nodes: vec![node],
                files: vec![file],
                export,
                changing: Arc::default(),
            },
        );
        nbd_probe::attach(&format!("nbd://{}/{name}", self.nbd))?;
        stages.mark("attached");
        Ok(None)
    }
}

impl QemuProvider {
    /// Waits until block job `job` has concluded, dismisses it; the bytes
    /// it moved, or its error.
    fn wait_for_job(&self, job: &str) -> Result<u64, String> {
        let deadline = Instant::now() + super::COMPACT_WITHIN;
        loop {
            let jobs = self.execute("query-jobs", json!({}))?;
            let state = jobs
                .as_array()
                .and_then(|jobs| jobs.iter().find(|j| j["id"] == job))
                .cloned()
                .ok_or_else(|| format!("block job {job} vanished before it concluded"))?;
            if state["status"] == "concluded" {
                self.execute("job-dismiss", json!({"id": job}))?;
                return match state["error"].as_str() {
                    Some(error) => Err(format!("block job {job} failed: {error}")),
                    None => Ok(state["current-progress"].as_u64().unwrap_or(0)),
                };
            }
            if Instant::now() > deadline {
                let _ = self.execute("job-cancel", json!({"id": job}));
                return Err(format!(
                    "block job {job} was not done within {:?}: cancelled",
                    super::COMPACT_WITHIN
                ));
            }
            std::thread::sleep(super::COMPACT_POLL);
        }
    }

    /// After `top` was streamed, the volume's nodes below it have no
    /// parent: they are closed (their files stay, for snapshots and
    /// clones). How many.
    fn drop_nodes_below(&self, volume: &str, top: &str) -> Result<usize, String> {
        let below: Vec<String> = {
            let mut volumes = self.volumes.lock();
            let Some(v) = volumes.get_mut(volume) else {
                return Ok(0); // deleted meanwhile, with its nodes
            };
            let at = v.nodes.iter().position(|n| n == top).unwrap_or(0);
            v.files.drain(..at);
            v.nodes.drain(..at).collect()
        };
        for node in below.iter().rev() {
            self.execute("blockdev-del", json!({"node-name": node}))?;
        }
        Ok(below.len())
    }
}

impl Provider for QemuProvider {
    fn name(&self) -> &'static str {
        "qemu"
    }

    fn create_volume(
        &self,
        name: &str,
        size: u64,
        cluster_size: Option<u64>,
        stages: &mut Stages,
    ) -> Result<Detail, String> {
        self.serve(name, size, cluster_size, None, stages)
    }

    fn delete_volume(&self, name: &str) -> Result<Detail, String> {
        let volume = self
            .volumes
            .lock()
            .remove(name)
            .ok_or_else(|| format!("no volume {name}"))?;
        self.execute("block-export-del", json!({"id": volume.export}))?;
        // The export lets its node go once its clients are gone.
        for node in volume.nodes.iter().rev() {
            let deadline = Instant::now() + Duration::from_secs(10);
            while let Err(e) = self.execute("blockdev-del", json!({"node-name": node})) {
                if Instant::now() > deadline {
                    return Err(e);
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        self.snapshots.lock().retain(|(v, _), _| v != name);
        // The files stay until the provider stops: a clone may read them.
        let _ = volume.files;
        Ok(None)
    }

    fn snapshot(&self, volume: &str, snapshot: &str) -> Result<Detail, String> {
        let changing = self.changing(volume)?;
        let _changing = changing.lock();
        let (top_node, top_file) = {
            let volumes = self.volumes.lock();
            let v = volumes
                .get(volume)
                .ok_or_else(|| format!("no volume {volume}"))?;
            (
                v.nodes.last().cloned().unwrap_or_default(),
                v.files.last().cloned().unwrap_or_default(),
            )
        };
        let size = self
            .execute("query-named-block-nodes", json!({"flat": true}))?
            .as_array()
            .and_then(|nodes| nodes.iter().find(|n| n["node-name"] == top_node.as_str()))
            .and_then(|n| n["image"]["virtual-size"].as_u64())
            .ok_or("cannot read the volume's size over QMP")?;
        let (node, file) = self.new_layer(size, None, Some(&top_file))?;
        self.open(&node, &file, true)?;
        let started = Instant::now();
        self.execute(
            "blockdev-snapshot",
            json!({"node": top_node, "overlay": node}),
        )?;
        let switch_ms = started.elapsed().as_secs_f64() * 1000.0;
        if let Some(v) = self.volumes.lock().get_mut(volume) {
            v.nodes.push(node);
            v.files.push(file);
        }
        self.snapshots
            .lock()
            .insert((volume.to_string(), snapshot.to_string()), top_file);
        Ok(Some(json!({"switch_ms": switch_ms})))
    }

    fn delete_snapshot(&self, _volume: &str, _snapshot: &str) -> Result<Detail, String> {
        Err("the QEMU provider does not delete external snapshots (that takes a block-commit, not done yet)".into())
    }

    fn clone_snapshot(
        &self,
        volume: &str,
        snapshot: &str,
        new: &str,
        stages: &mut Stages,
    ) -> Result<Detail, String> {
        let file = self
            .snapshots
            .lock()
            .get(&(volume.to_string(), snapshot.to_string()))
            .cloned()
            .ok_or_else(|| format!("no snapshot {volume}@{snapshot}"))?;
        let info = Command::new("qemu-img")
            .args(["info", "-U", "--output", "json"])
            .arg(&file)
            .output()
            .map_err(|e| format!("cannot run qemu-img: {e}"))?;
        let size = serde_json::from_slice::<Value>(&info.stdout)
            .ok()
            .and_then(|v| v["virtual-size"].as_u64())
            .ok_or_else(|| {
                format!(
                    "qemu-img info {}: {}",
                    file.display(),
                    String::from_utf8_lossy(&info.stderr).trim()
                )
            })?;
        self.serve(new, size, None, Some(&file), stages)
    }

    fn resize(&self, _volume: &str, _size: u64) -> Result<Detail, String> {
        Err("qemu-storage-daemon's NBD export does not share the resize permission: a volume cannot grow while exported".into())
    }

    fn compact(&self, volume: &str, stages: &mut Stages) -> Result<Detail, String> {
        let changing = self.changing(volume)?;
        let _changing = changing.lock();
        let top = self
            .volumes
            .lock()
            .get(volume)
            .and_then(|v| v.nodes.last().cloned())
            .ok_or_else(|| format!("no volume {volume}"))?;
        let job = format!(
            "compact-{top}-{}",
            self.counter.fetch_add(1, Ordering::SeqCst)
        );
        self.execute(
            "block-stream",
            json!({"job-id": job, "device": top, "auto-dismiss": false}),
        )?;
        stages.mark("accepted");
        let bytes = self.wait_for_job(&job)?;
        let removed = self.drop_nodes_below(volume, &top)?;
        Ok(Some(
            json!({"layers_removed": removed, "bytes_copied": bytes}),
        ))
    }

    fn fio_target(&self, volume: &str, _size: u64) -> Vec<String> {
        vec![
            "--ioengine=nbd".into(),
            format!("--uri=nbd://{}/{volume}", self.nbd),
        ]
    }

    fn uri(&self, volume: &str) -> Option<String> {
        Some(format!("nbd://{}/{volume}", self.nbd))
    }

    fn stores_data(&self) -> bool {
        true
    }

    fn volumes_named(&self, prefix: &str) -> Result<Vec<String>, String> {
        Ok(self
            .volumes
            .lock()
            .keys()
            .filter(|n| n.starts_with(prefix))
            .cloned()
            .collect())
    }

    fn shutdown(&self) -> Result<(), String> {
        let Some(mut child) = self.child.lock().take() else {
            return Ok(());
        };
        let _ = self.execute("quit", json!({}));
        let deadline = Instant::now() + START_WITHIN;
        let stopped = loop {
            match child.try_wait() {
                Ok(Some(_)) => break true,
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                _ => break false,
            }
        };
        if !stopped {
            let _ = child.kill();
            let _ = child.wait();
        }
        // The layer files are the provider's alone, made for this run.
        for entry in std::fs::read_dir(&self.dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.extension().is_some_and(|e| e == "qcow2") {
                let _ = std::fs::remove_file(path);
            }
        }
        if stopped {
            Ok(())
        } else {
            Err(format!(
                "qemu-storage-daemon did not quit within {START_WITHIN:?}; killed it"
            ))
        }
    }
}

impl Drop for QemuProvider {
    fn drop(&mut self) {
        let _ = self.shutdown();
    }
}
