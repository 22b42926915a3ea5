//! QEMU as the anchor: `qemu-storage-daemon` exporting qcow2 volumes over
//! NBD, driven over QMP as libvirt drives it: a volume is a qcow2 file
//! opened with `blockdev-add` and exported with `block-export-add`; a
//! snapshot is external (a new overlay file, `blockdev-snapshot` puts it on
//! top, the old top becomes the snapshot); a clone is a new overlay on a
//! snapshot's file; a compaction streams the volume's backing chain into
//! its top (`block-stream`), so that the top stands alone and the layers
//! below it are closed (their files stay: snapshots and clones read
//! them). Deleting a snapshot merges its layer with the one above it
//! (`block-commit`, or `block-stream` when a clone reads those layers), as
//! libvirt deletes external snapshots; a grow re-exports the volume around
//! `block_resize` (QEMU 10's NBD server fixes an export's size and forbids
//! resizing its node), so it needs the volume to have no NBD client.

use std::collections::{HashMap, HashSet};
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
/// Most events skipped while waiting for one command's reply (block jobs
/// send a few each; more means something floods the monitor).
const MAX_EVENTS_PER_REPLY: usize = 10_000;
/// How long a removed NBD export may take to let go of its node.
const EXPORT_GONE_WITHIN: Duration = Duration::from_secs(10);

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
        if !line.ends_with('\n') {
            return Err(format!(
                "QMP sent a line longer than {MAX_LINE} bytes: qemu-storage-daemon's replies here are small; see its log"
            ));
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
        for _ in 0..MAX_EVENTS_PER_REPLY {
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
            return reply.get("return").cloned().ok_or_else(|| {
                format!("{command}: QMP replied with neither `return` nor `error`")
            });
        }
        Err(format!(
            "{command}: more than {MAX_EVENTS_PER_REPLY} QMP events and no reply"
        ))
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
    /// Files some clone reads (its backing chain): a snapshot delete
    /// neither writes into them nor removes them.
    read_by_clones: Mutex<HashSet<PathBuf>>,
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
            read_by_clones: Mutex::new(HashSet::new()),
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
    /// it moved, or its error. An active commit reaches `ready` first
    /// (the layers hold the same data, writes go to both) and is told to
    /// complete, which makes its base the volume's top.
    fn wait_for_job(&self, job: &str) -> Result<u64, String> {
        let deadline = Instant::now() + super::COMPACT_WITHIN;
        let mut completing = false;
        loop {
            let jobs = self.execute("query-jobs", json!({}))?;
            let state = jobs
                .as_array()
                .and_then(|jobs| jobs.iter().find(|j| j["id"] == job))
                .cloned()
                .ok_or_else(|| format!("block job {job} vanished before it concluded"))?;
            let Some(status) = state["status"].as_str() else {
                return Err(format!("query-jobs: block job {job} has no `status`"));
            };
            if status == "ready" && !completing {
                self.execute("job-complete", json!({"id": job}))?;
                completing = true;
            }
            if status == "concluded" {
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

    /// The size in bytes of node `node`, as QEMU reports it.
    fn node_size(&self, node: &str) -> Result<u64, String> {
        self.execute("query-named-block-nodes", json!({"flat": true}))?
            .as_array()
            .and_then(|nodes| nodes.iter().find(|n| n["node-name"] == node))
            .and_then(|n| n["image"]["virtual-size"].as_u64())
            .ok_or_else(|| format!("cannot read the size of node {node} over QMP"))
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

/// A snapshot's layer in its volume's chain and the layer right above it
/// (the volume's top, or the next snapshot's file): (node, file) each.
struct SnapshotLayers {
    snapshot: (String, PathBuf),
    above: (String, PathBuf),
    /// The node below the snapshot's layer, if any.
    below: Option<String>,
    /// Whether `above` is the volume's top, which the NBD export writes.
    above_is_top: bool,
}

impl QemuProvider {
    /// Where snapshot file `file` sits in `volume`'s chain; `None` when a
    /// compaction took it out of the chain.
    fn snapshot_layers(&self, volume: &str, file: &Path) -> Result<Option<SnapshotLayers>, String> {
        let volumes = self.volumes.lock();
        let v = volumes
            .get(volume)
            .ok_or_else(|| format!("no volume {volume}"))?;
        let Some(at) = v.files.iter().position(|f| f == file) else {
            return Ok(None);
        };
        // A snapshot always has a layer above it: the overlay it was taken with.
        let (Some(node), Some(above_node), Some(above_file)) =
            (v.nodes.get(at), v.nodes.get(at + 1), v.files.get(at + 1))
        else {
            return Err(format!(
                "snapshot file {} is the top of volume {volume}: the provider's layers are inconsistent",
                file.display()
            ));
        };
        Ok(Some(SnapshotLayers {
            snapshot: (node.clone(), file.to_path_buf()),
            above: (above_node.clone(), above_file.clone()),
            below: at.checked_sub(1).and_then(|b| v.nodes.get(b)).cloned(),
            above_is_top: at + 2 == v.nodes.len(),
        }))
    }

    /// Deletes a snapshot as libvirt does: the layer above it is committed
    /// down into the snapshot's layer (which then holds the newer data)
    /// and removed, node and file. Commit, not stream, because it copies
    /// only what was written since the snapshot, and the layer removed is
    /// the newer one. When the layer above is the top, this is an active
    /// commit, and the export moves down to the snapshot's layer.
    fn merge_by_commit(&self, volume: &str, layers: &SnapshotLayers) -> Result<Value, String> {
        let (base, base_file) = &layers.snapshot;
        let (top, top_file) = &layers.above;
        let job = format!(
            "commit-{top}-{}",
            self.counter.fetch_add(1, Ordering::SeqCst)
        );
        let mut arguments =
            json!({"job-id": job, "device": top, "base-node": base, "auto-dismiss": false});
        if !layers.above_is_top {
            // An intermediate commit names the chain's top as its device.
            let device = self
                .volumes
                .lock()
                .get(volume)
                .and_then(|v| v.nodes.last().cloned());
            arguments["device"] = json!(device.ok_or_else(|| format!("no volume {volume}"))?);
            arguments["top-node"] = json!(top);
        }
        self.execute("block-commit", arguments)?;
        let bytes = self.wait_for_job(&job)?;
        self.forget_layer(volume, top)?;
        self.execute("blockdev-del", json!({"node-name": top}))?;
        std::fs::remove_file(top_file)
            .map_err(|e| format!("cannot remove {}: {e}", top_file.display()))?;
        // A later snapshot's state now lives in the snapshot's file.
        for file in self.snapshots.lock().values_mut() {
            if file == top_file {
                *file = base_file.clone();
            }
        }
        Ok(
            json!({"merge": "block-commit", "active": layers.above_is_top, "layers_removed": 1, "bytes_copied": bytes}),
        )
    }

    /// Deletes a snapshot whose layer (but not the one above) a clone
    /// reads: committing would write into the clone's layer (QEMU refuses,
    /// and the clone would change), so the other direction: the
    /// snapshot's layer is streamed up into the one above (whose data
    /// stays as it was) and taken out of the chain; its file stays.
    fn merge_by_stream(&self, volume: &str, layers: &SnapshotLayers) -> Result<Value, String> {
        let (node, file) = &layers.snapshot;
        let (above, _) = &layers.above;
        let job = format!(
            "stream-{above}-{}",
            self.counter.fetch_add(1, Ordering::SeqCst)
        );
        let mut arguments = json!({"job-id": job, "device": above, "auto-dismiss": false});
        if let Some(below) = &layers.below {
            arguments["base-node"] = json!(below);
        }
        self.execute("block-stream", arguments)?;
        let bytes = self.wait_for_job(&job)?;
        self.forget_layer(volume, node)?;
        self.execute("blockdev-del", json!({"node-name": node}))?;
        if !self.read_by_clones.lock().contains(file) {
            std::fs::remove_file(file)
                .map_err(|e| format!("cannot remove {}: {e}", file.display()))?;
        }
        Ok(
            json!({"merge": "block-stream", "active": false, "layers_removed": 1, "bytes_copied": bytes}),
        )
    }

    /// Takes node `node` out of `volume`'s layers.
    fn forget_layer(&self, volume: &str, node: &str) -> Result<(), String> {
        let mut volumes = self.volumes.lock();
        let v = volumes
            .get_mut(volume)
            .ok_or_else(|| format!("volume {volume} was deleted during its snapshot's delete"))?;
        if let Some(at) = v.nodes.iter().position(|n| n == node) {
            v.nodes.remove(at);
            v.files.remove(at);
        }
        Ok(())
    }

    /// Removes NBD export `export` of `volume` and waits until it has let
    /// go of its node. QEMU refuses while a client is attached.
    fn remove_export(&self, volume: &str, export: &str) -> Result<(), String> {
        self.execute("block-export-del", json!({"id": export})).map_err(|e| {
            format!(
                "cannot grow volume {volume}: {e}. QEMU 10's NBD server fixes an export's size and forbids resizing its node, so a grow re-exports the volume, which needs it to have no NBD client: grow volumes no workload is using"
            )
        })?;
        let deadline = Instant::now() + EXPORT_GONE_WITHIN;
        loop {
            let exports = self.execute("query-block-exports", json!({}))?;
            let exports = exports
                .as_array()
                .ok_or("query-block-exports: QMP replied with something not a list")?;
            if !exports.iter().any(|e| e["id"] == export) {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "NBD export {export} of volume {volume} was still there {EXPORT_GONE_WITHIN:?} after it was removed"
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Provider for QemuProvider {
    fn name(&self) -> &'static str {
        "qemu"
    }

    fn daemon_pid(&self) -> Option<u32> {
        self.child.lock().as_ref().map(Child::id)
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
        let size = self.node_size(&top_node)?;
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

    fn delete_snapshot(&self, volume: &str, snapshot: &str) -> Result<Detail, String> {
        let changing = self.changing(volume)?;
        let _changing = changing.lock();
        let key = (volume.to_string(), snapshot.to_string());
        let file = self
            .snapshots
            .lock()
            .get(&key)
            .cloned()
            .ok_or_else(|| format!("no snapshot {volume}@{snapshot}"))?;
        let layers = self.snapshot_layers(volume, &file)?;
        let detail = match layers {
            // A compaction streamed it into the top already: its file
            // stays for the clones that may read it, until the provider stops.
            None => json!({"merge": "none", "layers_removed": 0}),
            Some(layers) => {
                let (snapshot_read, above_read) = {
                    let read = self.read_by_clones.lock();
                    (
                        read.contains(&layers.snapshot.1),
                        read.contains(&layers.above.1),
                    )
                };
                if above_read {
                    // QEMU writes no file another node has open.
                    return Err(format!(
                        "cannot delete snapshot {volume}@{snapshot}: a clone reads its layers {} and {}, and QEMU writes no layer another node has open; delete the clones first",
                        layers.snapshot.1.display(),
                        layers.above.1.display()
                    ));
                }
                if snapshot_read {
                    self.merge_by_stream(volume, &layers)?
                } else {
                    self.merge_by_commit(volume, &layers)?
                }
            }
        };
        self.snapshots.lock().remove(&key);
        Ok(Some(detail))
    }

    fn clone_snapshot(
        &self,
        volume: &str,
        snapshot: &str,
        new: &str,
        stages: &mut Stages,
    ) -> Result<Detail, String> {
        // A snapshot delete's job holds the volume's layers (QEMU will not
        // share their reads with a new clone meanwhile), and may move the
        // snapshot to another file.
        let changing = self.changing(volume)?;
        let _changing = changing.lock();
        let file = self
            .snapshots
            .lock()
            .get(&(volume.to_string(), snapshot.to_string()))
            .cloned()
            .ok_or_else(|| format!("no snapshot {volume}@{snapshot}"))?;
        let info = Command::new("qemu-img")
            .args(["info", "-U", "--backing-chain", "--output", "json"])
            .arg(&file)
            .output()
            .map_err(|e| format!("cannot run qemu-img: {e}"))?;
        let chain = serde_json::from_slice::<Value>(&info.stdout).unwrap_or_default();
        let chain = chain.as_array().map(Vec::as_slice).unwrap_or_default();
        let size = chain
            .first()
            .and_then(|v| v["virtual-size"].as_u64())
            .ok_or_else(|| {
                format!(
                    "qemu-img info {}: {}",
                    file.display(),
                    String::from_utf8_lossy(&info.stderr).trim()
                )
            })?;
        let read: Vec<PathBuf> = chain
            .iter()
            .filter_map(|image| image["filename"].as_str().map(PathBuf::from))
            .collect();
        self.read_by_clones.lock().extend(read);
        self.serve(new, size, None, Some(&file), stages)
    }

    fn resize(&self, volume: &str, size: u64) -> Result<Detail, String> {
        let changing = self.changing(volume)?;
        let _changing = changing.lock();
        let (top, export) = self
            .volumes
            .lock()
            .get(volume)
            .and_then(|v| Some((v.nodes.last()?.clone(), v.export.clone())))
            .ok_or_else(|| format!("no volume {volume}"))?;
        let old_size = self.node_size(&top)?;
        if size < old_size {
            return Err(format!(
                "volume {volume} is {old_size} bytes: the QEMU provider grows volumes, it does not shrink them to {size}"
            ));
        }
        if size == old_size {
            return Ok(Some(json!({"old_size": old_size, "new_size": size})));
        }
        let started = Instant::now();
        self.remove_export(volume, &export)?;
        let resized = self.execute("block_resize", json!({"node-name": top, "size": size}));
        // Exported again even when the resize failed: the volume stays usable.
        let new_export = format!("e{top}-{}", self.counter.fetch_add(1, Ordering::SeqCst));
        self.execute(
            "block-export-add",
            json!({"type": "nbd", "id": new_export, "node-name": top, "name": volume, "writable": true}),
        )?;
        if let Some(v) = self.volumes.lock().get_mut(volume) {
            v.export = new_export;
        }
        resized?;
        let offline_ms = started.elapsed().as_secs_f64() * 1000.0;
        let seen = nbd_probe::attach(&format!("nbd://{}/{volume}", self.nbd))?;
        if seen != size {
            return Err(format!(
                "volume {volume} was grown to {size} bytes but its NBD export shows {seen}"
            ));
        }
        Ok(Some(
            json!({"old_size": old_size, "new_size": size, "offline_ms": offline_ms}),
        ))
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

#[cfg(test)]
#[path = "qemu_tests.rs"]
mod tests;
