//! Blocking HTTP clients (ureq) of the metadata service and of the
//! agents' transfer services: what the FUSE file system, the agents'
//! fetchers and the `strata f3` commands call. Every call has a timeout;
//! every answer is bounded and parsed, and a service's `{"error": ...}`
//! becomes an [`F3Error`] of the kind its status says.

use std::io::Read;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::error::ErrorKind;
use crate::invoke::{InvokeRequest, InvokeResult, SandboxStatus};
use crate::protocol::*;
use crate::{F3Error, Result};

/// How long a connection may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// How long a metadata call may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// Largest answer read from either service.
const MAX_ANSWER_BYTES: u64 = 64 * 1024 * 1024;

/// A client of the metadata service at one address.
#[derive(Clone)]
pub struct ServiceClient {
    address: String,
    agent: ureq::Agent,
}

impl std::fmt::Debug for ServiceClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServiceClient")
            .field("address", &self.address)
            .finish_non_exhaustive()
    }
}

fn http_agent(timeout: Duration) -> ureq::Agent {
    ureq::AgentBuilder::new()
        .timeout_connect(CONNECT_TIMEOUT)
        .timeout(timeout)
        .build()
}

impl ServiceClient {
    /// A client of the service at `address` (`HOST:PORT`).
    pub fn new(address: &str) -> ServiceClient {
        ServiceClient {
            address: address.to_string(),
            agent: http_agent(CALL_TIMEOUT),
        }
    }

    /// The service's address.
    pub fn address(&self) -> &str {
        &self.address
    }

    /// Registers a node or renews its lease.
    pub fn heartbeat(&self, node: &str, address: &str) -> Result<Lease> {
        self.post(
            "/v1/heartbeat",
            &Heartbeat {
                node: node.into(),
                address: address.into(),
            },
        )
    }

    /// Every registered node.
    pub fn nodes(&self) -> Result<Vec<NodeInfo>> {
        let url = format!("http://{}/v1/nodes", self.address);
        let result = self.agent.get(&url).call();
        parse(&self.address, "service", result)
    }

    /// One registered node.
    pub fn node(&self, name: &str) -> Result<NodeInfo> {
        check_node_name(name)?;
        let nodes = self.nodes()?;
        let known: Vec<String> = nodes.iter().take(20).map(|n| n.name.clone()).collect();
        nodes.into_iter().find(|n| n.name == name).ok_or_else(|| {
            F3Error::not_found(format!(
                "unknown node {name:?}: no `strata node` registered under that name (known: {})",
                if known.is_empty() {
                    "none".into()
                } else {
                    known.join(", ")
                }
            ))
        })
    }

    /// The events after number `after`, oldest first (at most `limit`).
    pub fn events(&self, after: u64, limit: usize) -> Result<EventPage> {
        let url = format!(
            "http://{}/v1/events?after={after}&limit={limit}",
            self.address
        );
        let result = self.agent.get(&url).call();
        parse(&self.address, "service", result)
    }

    /// The entry at `path`.
    pub fn stat(&self, path: &str) -> Result<Entry> {
        self.post("/v1/stat", &PathRequest { path: path.into() })
    }

    /// The entries of directory `path`.
    pub fn list(&self, path: &str) -> Result<Vec<Entry>> {
        let listing: Listing = self.post("/v1/list", &PathRequest { path: path.into() })?;
        Ok(listing.entries)
    }

    /// Creates a file (opened for writing by `request.node`) or a directory.
    pub fn create(&self, request: &CreateRequest) -> Result<Entry> {
        self.post("/v1/create", request)
    }

    /// Removes a file or an empty directory.
    pub fn remove(&self, path: &str) -> Result<Entry> {
        self.post("/v1/remove", &PathRequest { path: path.into() })
    }

    /// A node opened or closed a file for writing.
    pub fn writer(&self, request: &WriterRequest) -> Result<Entry> {
        self.post("/v1/writers", request)
    }

    /// Changes a file's size or tier, or a directory's marking.
    pub fn update(&self, request: &UpdateRequest) -> Result<Entry> {
        self.post("/v1/update", request)
    }

    /// Reports the bytes `node` holds of some files.
    pub fn report(&self, node: &str, files: Vec<HeldFile>) -> Result<serde_json::Value> {
        self.post(
            "/v1/report",
            &ReportRequest {
                node: node.into(),
                files,
            },
        )
    }

    /// Nodes by bytes held of `files`, most first.
    pub fn locality(&self, files: &[String]) -> Result<LocalityAnswer> {
        self.post(
            "/v1/locality",
            &LocalityQuery {
                files: files.to_vec(),
            },
        )
    }

    /// `POST route` with `body` as JSON; the answer parsed.
    pub fn post<T: DeserializeOwned>(&self, route: &str, body: &impl Serialize) -> Result<T> {
        let url = format!("http://{}{route}", self.address);
        let result = self.agent.post(&url).send_json(body);
        parse(&self.address, "service", result)
    }
}

/// A client of the agents' transfer services.
#[derive(Clone)]
pub struct AgentClient {
    agent: ureq::Agent,
}

impl std::fmt::Debug for AgentClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentClient").finish_non_exhaustive()
    }
}

/// A piece of an ephemeral file pulled from its holder.
#[derive(Debug)]
pub struct Piece {
    /// The bytes from the offset asked.
    pub bytes: Vec<u8>,
    /// The file's size on its holder when it answered.
    pub size: u64,
    /// Whether a writer had it open then.
    pub writing: bool,
    /// The generation of the content the bytes come from.
    pub generation: u64,
}

impl Default for AgentClient {
    fn default() -> Self {
        AgentClient::new()
    }
}

impl AgentClient {
    /// A client whose calls may wait up to a minute (persists upload).
    pub fn new() -> AgentClient {
        AgentClient {
            agent: http_agent(Duration::from_secs(60)),
        }
    }

    /// Up to `length` bytes of `path` from `offset`, from the holder at
    /// `address`; when no byte is there yet and a writer has the file
    /// open, the holder waits up to `wait` for some. The call fails if no
    /// whole answer came `patience` after that wait (a holder cut off
    /// answers nothing, not even a reset).
    pub fn fetch(
        &self,
        address: &str,
        path: &str,
        offset: u64,
        length: u64,
        wait: Duration,
        patience: Duration,
    ) -> Result<Piece> {
        let url = format!("http://{address}/v1/data");
        let last = offset.saturating_add(length.max(1)) - 1;
        let result = self
            .agent
            .get(&url)
            .timeout(wait + patience)
            .query("path", path)
            .query("wait_ms", &wait.as_millis().to_string())
            .set("Range", &format!("bytes={offset}-{last}"))
            .call();
        let response = match result {
            Ok(response) => response,
            Err(error) => return Err(call_error(address, "node", error)),
        };
        let header = |name: &str| {
            response
                .header(name)
                .and_then(|v| v.parse::<u64>().ok())
                .ok_or_else(|| {
                    F3Error::unavailable(format!(
                        "node at {address}: its answer for {path} has no valid {name} header"
                    ))
                })
        };
        let size = header(SIZE_HEADER)?;
        let writing = header(WRITING_HEADER)? == 1;
        let generation = header(GENERATION_HEADER)?;
        let mut bytes = Vec::new();
        response
            .into_reader()
            .take(length)
            .read_to_end(&mut bytes)
            .map_err(|e| F3Error::unavailable(format!("node at {address}: reading {path}: {e}")))?;
        Ok(Piece {
            bytes,
            size,
            writing,
            generation,
        })
    }

    /// Runs a function on the agent at `address`, waiting up to its
    /// timeout (and a margin for the sandbox's setup and teardown).
    pub fn invoke(&self, address: &str, request: &InvokeRequest) -> Result<InvokeResult> {
        let url = format!("http://{address}/v1/invoke");
        let wait = Duration::from_millis(request.timeout_ms) + Duration::from_secs(30);
        let result = self.agent.post(&url).timeout(wait).send_json(request);
        parse(address, "node", result)
    }

    /// The slots and warm sandboxes of the agent at `address`.
    pub fn sandboxes(&self, address: &str) -> Result<SandboxStatus> {
        let url = format!("http://{address}/v1/sandboxes");
        let result = self.agent.get(&url).timeout(CALL_TIMEOUT).call();
        parse(address, "node", result)
    }

    /// `POST route` on the agent at `address`.
    pub fn post<T: DeserializeOwned>(
        &self,
        address: &str,
        route: &str,
        body: &impl Serialize,
    ) -> Result<T> {
        let url = format!("http://{address}{route}");
        let result = self.agent.post(&url).send_json(body);
        parse(address, "node", result)
    }
}

/// The answer parsed, or the error the service sent.
fn parse<T: DeserializeOwned>(
    address: &str,
    what: &str,
    result: std::result::Result<ureq::Response, ureq::Error>,
) -> Result<T> {
    let response = result.map_err(|e| call_error(address, what, e))?;
    let mut text = String::new();
    response
        .into_reader()
        .take(MAX_ANSWER_BYTES)
        .read_to_string(&mut text)
        .map_err(|e| {
            F3Error::unavailable(format!("F3 {what} at {address}: reading its answer: {e}"))
        })?;
    serde_json::from_str(&text).map_err(|e| {
        F3Error::unavailable(format!(
            "F3 {what} at {address}: its answer is not what was expected: {e}"
        ))
    })
}

/// A failed call as an [`F3Error`]: the service's own message when it
/// answered, else why it could not be reached.
fn call_error(address: &str, what: &str, error: ureq::Error) -> F3Error {
    match error {
        ureq::Error::Status(status, response) => {
            let mut text = String::new();
            let _ = response
                .into_reader()
                .take(64 * 1024)
                .read_to_string(&mut text);
            let message = serde_json::from_str::<ErrorAnswer>(&text)
                .map(|a| a.error)
                .unwrap_or_else(|_| format!("HTTP {status}: {}", text.trim()));
            let kind = match status {
                400 | 416 => ErrorKind::Invalid,
                404 => ErrorKind::NotFound,
                409 => ErrorKind::Conflict,
                _ => ErrorKind::Unavailable,
            };
            F3Error::new(kind, message)
        }
        ureq::Error::Transport(transport) => {
            let hint = if what == "service" {
                "; is `strata f3 serve` running there (--meta, STRATA_F3)?"
            } else {
                "; is its `strata node` running?"
            };
            F3Error::unavailable(format!(
                "cannot reach the F3 {what} at {address}: {transport}{hint}"
            ))
        }
    }
}
