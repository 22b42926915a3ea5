//! The JSON messages of the metadata service (`strata f3 serve`) and of
//! the agents' transfer services (`strata node`). Every request is
//! bounded ([`MAX_REQUEST_BYTES`], [`MAX_FILES_PER_REQUEST`]) and checked
//! by [`check`](ReportRequest::check)-style methods before it is used.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::path::NamespacePath;
use crate::{F3Error, Result};

/// Largest request body either service reads.
pub const MAX_REQUEST_BYTES: usize = 1024 * 1024;

/// Most files one locality report or query names.
pub const MAX_FILES_PER_REQUEST: usize = 4096;

/// Most entries one directory listing returns.
pub const MAX_LISTED_ENTRIES: usize = 100_000;

/// Longest node name.
pub const MAX_NODE_NAME_BYTES: usize = 63;

/// Longest transfer address a node registers.
pub const MAX_ADDRESS_BYTES: usize = 128;

/// The default address of the metadata service.
pub const DEFAULT_SERVICE_ADDRESS: &str = "127.0.0.1:10893";

/// The suffix that makes a file ephemeral by its name.
pub const EPHEMERAL_SUFFIX: &str = ".eph";

/// The extended attribute that marks a directory ephemeral (value `1`)
/// or durable (`0`): files and directories made in it inherit it.
pub const EPHEMERAL_XATTR: &str = "user.strata.ephemeral";

/// The read-only extended attribute that names a file's holder node.
pub const HOLDER_XATTR: &str = "user.strata.holder";

/// The extended attribute naming the step (of a workflow, or any
/// producer) that wrote a file: kept with its metadata and named in the
/// event of its loss, so a planner can run that step again.
pub const PRODUCER_XATTR: &str = "user.strata.producer";

/// Longest producer name kept.
pub const MAX_PRODUCER_BYTES: usize = 256;

/// Response header of a transfer: the file's size on its holder now.
pub const SIZE_HEADER: &str = "x-f3-size";

/// Response header of a transfer: `1` while a writer has the file open.
pub const WRITING_HEADER: &str = "x-f3-writing";

/// Response header of a transfer: the generation of the content the
/// bytes come from, which changes whenever a writer opens the file or it
/// is truncated (a copy fetched by ranges takes every range from one).
pub const GENERATION_HEADER: &str = "x-f3-generation";

/// A file or directory of the namespace, as the metadata service keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// Its path.
    pub path: String,
    /// Whether it is a directory.
    pub directory: bool,
    /// For a file, whether its content is ephemeral (on its holder's disk)
    /// rather than an object in the store; for a directory, whether files
    /// made in it are ephemeral (the inherited marking).
    pub ephemeral: bool,
    /// The node whose disk holds an ephemeral file's content.
    pub holder: Option<String>,
    /// Size in bytes, as last reported (at create, at each writer's close,
    /// at persist).
    pub size: u64,
    /// Raised whenever the content is replaced (created again, truncated,
    /// written, persisted), so copies of an older content are never used.
    pub version: u64,
    /// Open writers, by node.
    pub writers: BTreeMap<String, u32>,
    /// Bytes of the content each node holds (the holder, and nodes that
    /// pulled a copy), as they reported it.
    pub held: BTreeMap<String, u64>,
    /// Last change, milliseconds since the Unix epoch.
    pub modified_ms: u64,
    /// The step that wrote it, if one was named ([`PRODUCER_XATTR`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub producer: Option<String>,
}

/// A node as the service knows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeInfo {
    /// Its name.
    pub name: String,
    /// Its transfer service's address (`HOST:PORT`).
    pub address: String,
    /// Whether its lease is current (a heartbeat within the lease).
    pub alive: bool,
    /// Milliseconds since its last heartbeat (none since the service
    /// started: `None`).
    pub silent_ms: Option<u64>,
}

/// `POST /v1/heartbeat`: a node registers or renews its lease.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Heartbeat {
    /// The node's name.
    pub node: String,
    /// Its transfer service's address.
    pub address: String,
}

/// The answer to a heartbeat.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Lease {
    /// How long the lease lasts without another heartbeat.
    pub lease_ms: u64,
}

/// A request that names one path (`stat`, `list`, `remove`, persist and
/// evict on an agent).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PathRequest {
    /// The path.
    pub path: String,
}

/// `POST /v1/create`: a new file or directory.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CreateRequest {
    /// Its path; its parent must be a directory.
    pub path: String,
    /// A directory rather than a file.
    pub directory: bool,
    /// Ephemeral (see [`Entry::ephemeral`]).
    pub ephemeral: bool,
    /// The creating node: an ephemeral file's holder, and the writer of a
    /// new file.
    pub node: String,
    /// Replace an existing file's content (`O_TRUNC` on a name that
    /// exists) rather than refuse the name.
    #[serde(default)]
    pub replace: bool,
}

/// `POST /v1/writers`: a node opened (`opened: true`) or closed a file for
/// writing; a close reports the size.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WriterRequest {
    /// The file.
    pub path: String,
    /// The node.
    pub node: String,
    /// Opened (true) or closed (false).
    pub opened: bool,
    /// The size at close.
    pub size: Option<u64>,
}

/// `POST /v1/update`: a change of a file's content or tier, or of a
/// directory's marking.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct UpdateRequest {
    /// The file or directory.
    pub path: String,
    /// A new size (a truncate, a durable file's upload); raises the version.
    pub size: Option<u64>,
    /// A new tier for a file (persist: `false`), or marking for a directory.
    pub ephemeral: Option<bool>,
    /// With `ephemeral: Some(false)` on a file: forget its holder.
    #[serde(default)]
    pub clear_holder: bool,
    /// The step that wrote the file (empty: none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub producer: Option<String>,
}

/// Checks a producer's name: at most [`MAX_PRODUCER_BYTES`] printable
/// characters.
pub fn check_producer(producer: &str) -> Result<()> {
    if producer.len() <= MAX_PRODUCER_BYTES && !producer.chars().any(char::is_control) {
        Ok(())
    } else {
        Err(F3Error::invalid(format!(
            "producer {:?}: give at most {MAX_PRODUCER_BYTES} bytes of printable text",
            producer.chars().take(80).collect::<String>()
        )))
    }
}

/// What happened to an ephemeral file's content.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EventKind {
    /// Its holder's lease lapsed: reads of it get EIO.
    Lost,
    /// Its holder came back: it reads again.
    Recovered,
}

/// An event of the namespace (`GET /v1/events`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    /// Its number: events are numbered in the order they happened.
    pub seq: u64,
    /// What happened.
    pub kind: EventKind,
    /// The file.
    pub path: String,
    /// The node that held it.
    pub holder: String,
    /// The step that wrote it, if one was named: the one to run again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub producer: Option<String>,
    /// Its size, as last reported.
    pub size: u64,
    /// When, milliseconds since the Unix epoch.
    pub at_ms: u64,
}

/// `GET /v1/events`: the events after `seq` (`after`), oldest first.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct EventPage {
    /// At most the limit asked (1,000 by default and at most).
    pub events: Vec<Event>,
    /// The number of the newest event kept (0: none yet).
    pub last: u64,
}

/// One file a node holds bytes of.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct HeldFile {
    /// The file.
    pub path: String,
    /// Bytes of it the node holds (0: none any more).
    pub bytes: u64,
}

/// `POST /v1/report`: what a node holds of some files.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ReportRequest {
    /// The reporting node.
    pub node: String,
    /// The files.
    pub files: Vec<HeldFile>,
}

impl ReportRequest {
    /// Checks the node's name, the number of files and every path.
    pub fn check(&self) -> Result<Vec<(NamespacePath, u64)>> {
        check_node_name(&self.node)?;
        if self.files.is_empty() || self.files.len() > MAX_FILES_PER_REQUEST {
            return Err(F3Error::invalid(format!(
                "a locality report names 1 to {MAX_FILES_PER_REQUEST} files; this one names {}",
                self.files.len()
            )));
        }
        self.files
            .iter()
            .map(|file| Ok((NamespacePath::parse(&file.path)?, file.bytes)))
            .collect()
    }
}

/// `POST /v1/locality`: which nodes hold the most bytes of these files.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LocalityQuery {
    /// The files.
    pub files: Vec<String>,
}

/// One node's share of some files' bytes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeBytes {
    /// The node.
    pub node: String,
    /// Bytes of the files it holds.
    pub bytes: u64,
    /// Whether its lease is current.
    pub alive: bool,
}

/// The answer to a locality query: nodes by bytes held, most first.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LocalityAnswer {
    /// The nodes that hold any of the bytes, most first.
    pub nodes: Vec<NodeBytes>,
    /// Files the query named that do not exist.
    pub missing: Vec<String>,
}

/// A listing's answer.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Listing {
    /// The directory's entries, by name.
    pub entries: Vec<Entry>,
}

/// An error answer of either service.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ErrorAnswer {
    /// What went wrong and what to do.
    pub error: String,
}

/// Checks a node's name: 1 to 63 bytes of letters, digits, `-`, `_`, `.`.
pub fn check_node_name(name: &str) -> Result<()> {
    check_short_name("node name", name, MAX_NODE_NAME_BYTES)
}

/// Checks a short name (`what`, such as "node name"): 1 to `most` bytes
/// of letters, digits, `-`, `_`, `.`; the error says so.
pub fn check_short_name(what: &str, name: &str, most: usize) -> Result<()> {
    let fine = !name.is_empty()
        && name.len() <= most
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.');
    if fine {
        Ok(())
    } else {
        Err(F3Error::invalid(format!(
            "{what} {:?}: give 1 to {most} letters, digits, '-', '_' or '.'",
            name.chars().take(80).collect::<String>()
        )))
    }
}

/// Checks a transfer address: `HOST:PORT`, bounded.
pub fn check_address(address: &str) -> Result<()> {
    if address.is_empty()
        || address.len() > MAX_ADDRESS_BYTES
        || address.parse::<std::net::SocketAddr>().is_err()
    {
        return Err(F3Error::invalid(format!(
            "transfer address {:?}: give IP:PORT",
            address.chars().take(80).collect::<String>()
        )));
    }
    Ok(())
}

/// Milliseconds since the Unix epoch.
pub fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}
