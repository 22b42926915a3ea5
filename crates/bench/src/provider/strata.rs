//! Strata's volume daemon as a provider, through its HTTP API
//! (docs/openapi/volume.yaml); volumes are reached over its NBD exports.
//! When a run names no daemon, one is started on embedded defaults with
//! its pool in the run directory, and stopped at the end.

use std::io::{BufRead, BufReader, Read};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use serde_json::{json, Value};

use super::{nbd_probe, Detail, Provider, Stages};

/// How long a started daemon may take to print its readiness line.
const READY_WITHIN: Duration = Duration::from_secs(30);
/// How long a started daemon may take to stop after SIGTERM.
const STOP_WITHIN: Duration = Duration::from_secs(20);
/// How long one API request may take (a snapshot with `sync`, a delete of
/// a big volume).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(120);

/// A Strata volume daemon, reached through its API.
pub struct StrataProvider {
    agent: ureq::Agent,
    base: String,
    token: Option<String>,
    /// `HOST:PORT` of the NBD exports (from the readiness line, or from
    /// the first volume the API describes).
    nbd: Mutex<Option<String>>,
    daemon: Mutex<Option<Child>>,
}

impl StrataProvider {
    /// A running daemon at `api` (`HOST:PORT`), with its API token if it
    /// checks one.
    pub fn connect(api: &str, token: Option<String>) -> StrataProvider {
        StrataProvider {
            agent: ureq::AgentBuilder::new()
                .timeout_connect(Duration::from_secs(5))
                .timeout(REQUEST_TIMEOUT)
                .build(),
            base: format!("http://{api}"),
            token,
            nbd: Mutex::new(None),
            daemon: Mutex::new(None),
        }
    }

    /// Starts `strata daemon` (the binary at `strata`) on the pool
    /// `pool`, on free loopback ports, with its log in `log`; waits for
    /// its readiness line.
    pub fn start(strata: &Path, pool: &Path, log: &Path) -> Result<StrataProvider, String> {
        let log_file = std::fs::File::create(log)
            .map_err(|e| format!("cannot create the daemon's log {}: {e}", log.display()))?;
        let mut child = Command::new(strata)
            .args([
                "daemon",
                "--listen",
                "127.0.0.1:0",
                "--nbd-port",
                "0",
                "--pool",
            ])
            .arg(pool)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(log_file)
            // Its own process group: Ctrl-C in the terminal reaches the run,
            // which cleans up through the daemon before stopping it.
            .process_group(0)
            .spawn()
            .map_err(|e| format!("cannot start {} daemon: {e}", strata.display()))?;
        let line = match readiness_line(&mut child) {
            Ok(line) => line,
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("{e}; its log is {}", log.display()));
            }
        };
        // "strata: daemon serving N volumes over NBD on ADDR, API on http://ADDR, pool DIR"
        let field = |key: &str| {
            line.split(key)
                .nth(1)
                .and_then(|s| s.split(',').next())
                .map(str::to_string)
        };
        let (Some(nbd), Some(api)) = (field(" on "), field("http://")) else {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!(
                "the daemon's readiness line has no addresses: {line:?}"
            ));
        };
        let token = std::fs::read_to_string(pool.join("api.token"))
            .ok()
            .map(|t| t.trim().to_string());
        let provider = StrataProvider::connect(&api, token);
        *provider.nbd.lock() = Some(nbd);
        *provider.daemon.lock() = Some(child);
        Ok(provider)
    }

    /// The API's address (`HOST:PORT`).
    pub fn api(&self) -> &str {
        self.base.trim_start_matches("http://")
    }

    /// Stops the daemon this provider started (SIGTERM, then SIGKILL if it
    /// is still there after [`STOP_WITHIN`]); nothing for one it reached.
    pub fn stop(&self) -> Result<(), String> {
        let Some(mut child) = self.daemon.lock().take() else {
            return Ok(());
        };
        // SAFETY: signalling a child this provider started and has not reaped.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + STOP_WITHIN;
        while Instant::now() < deadline {
            match child.try_wait() {
                Ok(Some(status)) if status.success() => return Ok(()),
                Ok(Some(status)) => return Err(format!("the daemon exited with {status}")),
                Ok(None) => std::thread::sleep(Duration::from_millis(20)),
                Err(e) => return Err(format!("cannot wait for the daemon: {e}")),
            }
        }
        let _ = child.kill();
        let _ = child.wait();
        Err(format!(
            "the daemon did not stop within {STOP_WITHIN:?} of SIGTERM; killed it"
        ))
    }

    /// One API call; the JSON reply, or the API's error with its status.
    fn call(&self, method: &str, path: &str, body: Option<Value>) -> Result<Value, String> {
        let mut request = self.agent.request(method, &format!("{}{path}", self.base));
        if let Some(token) = &self.token {
            request = request.set("Authorization", &format!("Bearer {token}"));
        }
        let reply = match body {
            Some(body) => request.send_json(body),
            None => request.call(),
        };
        match reply {
            Ok(reply) => reply
                .into_json()
                .map_err(|e| format!("{method} {path}: unreadable reply: {e}")),
            Err(ureq::Error::Status(code, reply)) => {
                let value: Value = reply.into_json().unwrap_or(Value::Null);
                let message = value["error"].as_str().unwrap_or("no message");
                Err(format!("{method} {path}: {message} (HTTP {code})"))
            }
            Err(e) => Err(format!("cannot reach the daemon at {}: {e}", self.base)),
        }
    }

    /// Notes the NBD address from a volume's `nbd_uri`, then attaches to it.
    fn attach(&self, volume: &Value, stages: &mut Stages) -> Result<(), String> {
        if let Some((address, _)) = volume["nbd_uri"].as_str().and_then(nbd_probe::split_uri) {
            self.nbd.lock().get_or_insert_with(|| address.to_string());
        }
        let name = volume["name"].as_str().unwrap_or_default();
        let uri = self.uri(name).ok_or("the daemon gave no NBD address")?;
        nbd_probe::attach(&uri)?;
        stages.mark("attached");
        Ok(())
    }
}

/// The first line a child prints on stdout, within [`READY_WITHIN`]; its
/// stdout is drained afterwards so that it never blocks on a full pipe.
fn readiness_line(child: &mut Child) -> Result<String, String> {
    let stdout = child.stdout.take().ok_or("the daemon has no stdout")?;
    let (sender, receiver) = mpsc::channel();
    std::thread::spawn(move || {
        let mut lines = BufReader::new(stdout).lines();
        let _ = sender.send(lines.next());
        for _ in lines {}
    });
    match receiver.recv_timeout(READY_WITHIN) {
        Ok(Some(Ok(line))) => Ok(line),
        Ok(_) => Err("the daemon exited before it was ready".into()),
        Err(_) => Err(format!("the daemon was not ready within {READY_WITHIN:?}")),
    }
}

/// A path segment: names are checked by the daemon, but a name must not
/// turn into another path on the way.
fn segment(name: &str) -> Result<&str, String> {
    if name.is_empty() || name.contains(['/', '?', '#', '%']) {
        return Err(format!("name {name:?} cannot go in an API path"));
    }
    Ok(name)
}

impl Provider for StrataProvider {
    fn name(&self) -> &'static str {
        "strata"
    }

    fn create_volume(
        &self,
        name: &str,
        size: u64,
        cluster_size: Option<u64>,
        stages: &mut Stages,
    ) -> Result<Detail, String> {
        let mut body = json!({"name": segment(name)?, "size": size});
        if let Some(cluster_size) = cluster_size {
            body["cluster_size"] = json!(cluster_size);
        }
        let volume = self.call("POST", "/v1/volumes", Some(body))?;
        stages.mark("created");
        self.attach(&volume, stages)?;
        Ok(None)
    }

    /// Asks the daemon for the volume (its reply names the export, as a
    /// create's does), then attaches.
    fn attach_volume(&self, volume: &str, stages: &mut Stages) -> Result<Detail, String> {
        let described = self.call("GET", &format!("/v1/volumes/{}", segment(volume)?), None)?;
        self.attach(&described, stages)?;
        Ok(None)
    }

    fn delete_volume(&self, name: &str) -> Result<Detail, String> {
        self.call("DELETE", &format!("/v1/volumes/{}", segment(name)?), None)
            .map(|_| None)
    }

    fn snapshot(&self, volume: &str, snapshot: &str) -> Result<Detail, String> {
        let reply = self.call(
            "POST",
            &format!("/v1/volumes/{}/snapshots", segment(volume)?),
            Some(json!({"name": segment(snapshot)?})),
        )?;
        Ok(Some(
            json!({"pause_ms": reply["pause_ms"], "total_ms": reply["total_ms"]}),
        ))
    }

    fn delete_snapshot(&self, volume: &str, snapshot: &str) -> Result<Detail, String> {
        let path = format!(
            "/v1/volumes/{}/snapshots/{}",
            segment(volume)?,
            segment(snapshot)?
        );
        self.call("DELETE", &path, None).map(|_| None)
    }

    fn clone_snapshot(
        &self,
        volume: &str,
        snapshot: &str,
        new: &str,
        stages: &mut Stages,
    ) -> Result<Detail, String> {
        let path = format!(
            "/v1/volumes/{}/snapshots/{}/clone",
            segment(volume)?,
            segment(snapshot)?
        );
        let clone = self.call("POST", &path, Some(json!({"name": segment(new)?})))?;
        stages.mark("created");
        self.attach(&clone, stages)?;
        Ok(None)
    }

    fn resize(&self, volume: &str, size: u64) -> Result<Detail, String> {
        let reply = self.call(
            "POST",
            &format!("/v1/volumes/{}/resize", segment(volume)?),
            Some(json!({"size": size})),
        )?;
        Ok(Some(json!({"pause_ms": reply["pause_ms"]})))
    }

    fn compact(&self, volume: &str, stages: &mut Stages) -> Result<Detail, String> {
        let path = format!("/v1/volumes/{}/compact", segment(volume)?);
        let refusal = match self.call("POST", &path, Some(json!({}))) {
            Ok(_) => None,
            // Perhaps the daemon's own automatic compaction of this volume
            // is running: then this waits for that one, which does the
            // same work.
            Err(e) if e.contains("HTTP 409") => Some(e),
            Err(e) => return Err(e),
        };
        let joined = refusal.is_some();
        if joined && self.call("GET", &path, None)?["state"] != "running" {
            return Err(refusal.unwrap_or_default());
        }
        stages.mark("accepted");
        let deadline = Instant::now() + super::COMPACT_WITHIN;
        loop {
            let status = self.call("GET", &path, None)?;
            match status["state"].as_str() {
                Some("running") if Instant::now() < deadline => {
                    std::thread::sleep(super::COMPACT_POLL)
                }
                Some("running") => {
                    return Err(format!(
                        "the compaction of {volume} was still running after {:?}: left running",
                        super::COMPACT_WITHIN
                    ))
                }
                Some("done") => {
                    return Ok(Some(json!({
                        "joined_running": joined,
                        "layers_before": status["layers_before"],
                        "layers_removed": status["layers_removed"],
                        "bytes_copied": status["bytes_copied"],
                        "max_pause_ms": status["max_pause_ms"],
                    })))
                }
                state => {
                    return Err(format!(
                        "compaction of {volume} ended {}: {}",
                        state.unwrap_or("in an unknown state"),
                        status["error"].as_str().unwrap_or("no error given")
                    ))
                }
            }
        }
    }

    fn fio_target(&self, volume: &str, _size: u64) -> Vec<String> {
        let uri = self.uri(volume).unwrap_or_default();
        vec!["--ioengine=nbd".into(), format!("--uri={uri}")]
    }

    fn uri(&self, volume: &str) -> Option<String> {
        self.nbd
            .lock()
            .as_ref()
            .map(|address| format!("nbd://{address}/{volume}"))
    }

    fn stores_data(&self) -> bool {
        true
    }

    fn volumes_named(&self, prefix: &str) -> Result<Vec<String>, String> {
        let volumes = self.call("GET", "/v1/volumes", None)?;
        let list = volumes.as_array().ok_or("GET /v1/volumes: not a list")?;
        Ok(list
            .iter()
            .filter_map(|v| v["name"].as_str())
            .filter(|name| name.starts_with(prefix))
            .map(str::to_string)
            .collect())
    }

    fn daemon_pid(&self) -> Option<u32> {
        self.daemon.lock().as_ref().map(Child::id)
    }

    fn metrics(&self) -> Option<Result<String, String>> {
        let reply = match self.agent.get(&format!("{}/metrics", self.base)).call() {
            Ok(reply) => reply,
            Err(e) => return Some(Err(format!("GET {}/metrics: {e}", self.base))),
        };
        let mut text = String::new();
        let read = reply
            .into_reader()
            .take(crate::metrics::MAX_SCRAPE_BYTES)
            .read_to_string(&mut text);
        Some(
            read.map(|_| text)
                .map_err(|e| format!("GET {}/metrics: unreadable reply: {e}", self.base)),
        )
    }

    fn shutdown(&self) -> Result<(), String> {
        self.stop()
    }
}

impl Drop for StrataProvider {
    fn drop(&mut self) {
        // A daemon this provider started never outlives it; the stop's
        // outcome was reported by an explicit `stop` where it mattered.
        let _ = self.stop();
    }
}
