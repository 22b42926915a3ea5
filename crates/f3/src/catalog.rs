//! The namespace's metadata, kept durably in redb: one record per file and
//! directory (path, tier, holder node, size, version, open writers, bytes
//! held per node), and each node's transfer address. Nodes' leases are
//! kept in memory: after a restart of the service every node is silent
//! until its next heartbeat (within a second).

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use redb::{ReadableTable, ReadableTableMetadata, TableDefinition};

use crate::path::NamespacePath;
use crate::protocol::{
    check_address, check_node_name, check_producer, unix_ms, CreateRequest, Entry, NodeBytes,
    NodeInfo, UpdateRequest, WriterRequest, MAX_LISTED_ENTRIES,
};
use crate::{F3Error, Result};

/// Path → the JSON of its [`Entry`].
pub(crate) const FILES: TableDefinition<&str, &[u8]> = TableDefinition::new("files");

/// Node name → its transfer address.
const NODES: TableDefinition<&str, &str> = TableDefinition::new("nodes");

/// The file the catalog lives in, inside the service's directory.
pub const CATALOG_FILE: &str = "f3-catalog.redb";

/// Most nodes the catalog registers (a bound on what heartbeats can add).
pub const MAX_NODES: usize = 4096;

/// Most writers of one file on one node.
const MAX_WRITERS_PER_NODE: u32 = 1 << 20;

/// The namespace's metadata and the nodes' leases.
pub struct Catalog {
    pub(crate) database: redb::Database,
    pub(crate) leases: Mutex<HashMap<String, Instant>>,
    lease: Duration,
    /// Nodes whose lease lapsed and whose files' loss was announced
    /// ([`crate::events`]).
    pub(crate) lapsed: Mutex<std::collections::HashSet<String>>,
}

impl std::fmt::Debug for Catalog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Catalog")
            .field("lease", &self.lease)
            .finish_non_exhaustive()
    }
}

pub(crate) fn store_error(what: &str, error: impl std::fmt::Display) -> F3Error {
    F3Error::new(
        crate::error::ErrorKind::Io,
        format!("the F3 catalog: {what}: {error}"),
    )
}

impl Catalog {
    /// Opens (or creates) the catalog in `dir`, with nodes' leases lasting
    /// `lease`.
    pub fn open(dir: &Path, lease: Duration) -> Result<Catalog> {
        std::fs::create_dir_all(dir)
            .map_err(|e| F3Error::io(format!("creating {}", dir.display()), e))?;
        let file = dir.join(CATALOG_FILE);
        let database = redb::Database::create(&file)
            .map_err(|e| store_error(&format!("opening {}", file.display()), e))?;
        let catalog = Catalog {
            database,
            leases: Mutex::new(HashMap::new()),
            lease,
            lapsed: Mutex::new(std::collections::HashSet::new()),
        };
        catalog.write(|files, _| {
            if files
                .get("/")
                .map_err(|e| store_error("reading /", e))?
                .is_none()
            {
                let root = Entry {
                    path: "/".into(),
                    directory: true,
                    ephemeral: false,
                    holder: None,
                    size: 0,
                    version: 1,
                    writers: BTreeMap::new(),
                    held: BTreeMap::new(),
                    modified_ms: unix_ms(),
                    producer: None,
                };
                put(files, &root)?;
            }
            Ok(())
        })?;
        Ok(catalog)
    }

    /// How long a lease lasts.
    pub fn lease(&self) -> Duration {
        self.lease
    }

    /// Registers `node` at `address`, or renews its lease.
    pub fn heartbeat(&self, node: &str, address: &str) -> Result<()> {
        check_node_name(node)?;
        check_address(address)?;
        self.write(|_, nodes| {
            let known = nodes
                .get(node)
                .map_err(|e| store_error("reading a node", e))?
                .map(|v| v.value().to_string());
            if known.as_deref() != Some(address) {
                if known.is_none()
                    && ReadableTableMetadata::len(&*nodes)
                        .map_err(|e| store_error("counting", e))? as usize
                        >= MAX_NODES
                {
                    return Err(F3Error::conflict(format!(
                        "node {node}: the catalog holds {MAX_NODES} nodes already"
                    )));
                }
                nodes
                    .insert(node, address)
                    .map_err(|e| store_error("registering a node", e))?;
            }
            Ok(())
        })?;
        self.leases.lock().insert(node.to_string(), Instant::now());
        if self.lapsed.lock().remove(node) {
            self.announce_holder(node, crate::protocol::EventKind::Recovered)?;
        }
        Ok(())
    }

    /// Every registered node, by name.
    pub fn nodes(&self) -> Result<Vec<NodeInfo>> {
        let txn = self
            .database
            .begin_read()
            .map_err(|e| store_error("reading", e))?;
        let table = txn
            .open_table(NODES)
            .map_err(|e| store_error("opening the nodes", e))?;
        let leases = self.leases.lock();
        let mut out = Vec::new();
        for row in table.iter().map_err(|e| store_error("listing nodes", e))? {
            let (name, address) = row.map_err(|e| store_error("listing nodes", e))?;
            let silent = leases.get(name.value()).map(|seen| seen.elapsed());
            out.push(NodeInfo {
                name: name.value().to_string(),
                address: address.value().to_string(),
                alive: silent.is_some_and(|s| s < self.lease),
                silent_ms: silent.map(|s| s.as_millis() as u64),
            });
        }
        Ok(out)
    }

    /// One node, or NotFound naming the known ones.
    pub fn node(&self, name: &str) -> Result<NodeInfo> {
        check_node_name(name)?;
        let nodes = self.nodes()?;
        let names: Vec<String> = nodes.iter().take(20).map(|n| n.name.clone()).collect();
        nodes.into_iter().find(|n| n.name == name).ok_or_else(|| {
            F3Error::not_found(format!(
                "unknown node {name:?}: no `strata node` registered under that name \
                     (known: {})",
                if names.is_empty() {
                    "none".to_string()
                } else {
                    names.join(", ")
                }
            ))
        })
    }

    /// The entry at `path`.
    pub fn stat(&self, path: &NamespacePath) -> Result<Entry> {
        let txn = self
            .database
            .begin_read()
            .map_err(|e| store_error("reading", e))?;
        let table = txn
            .open_table(FILES)
            .map_err(|e| store_error("opening the files", e))?;
        get(&table, path.as_str())?
            .ok_or_else(|| F3Error::not_found(format!("{path}: no such file or directory in F3")))
    }

    /// The entries of directory `path`, by name.
    pub fn list(&self, path: &NamespacePath) -> Result<Vec<Entry>> {
        let directory = self.stat(path)?;
        if !directory.directory {
            return Err(F3Error::invalid(format!(
                "{path} is a file, not a directory"
            )));
        }
        let prefix = path.child_prefix();
        let txn = self
            .database
            .begin_read()
            .map_err(|e| store_error("reading", e))?;
        let table = txn
            .open_table(FILES)
            .map_err(|e| store_error("opening the files", e))?;
        let mut out = Vec::new();
        for row in table
            .range(prefix.as_str()..)
            .map_err(|e| store_error("listing", e))?
        {
            let (key, value) = row.map_err(|e| store_error("listing", e))?;
            let Some(rest) = key.value().strip_prefix(prefix.as_str()) else {
                break;
            };
            if rest.is_empty() || rest.contains('/') {
                continue;
            }
            out.push(decode(key.value(), value.value())?);
            if out.len() >= MAX_LISTED_ENTRIES {
                break;
            }
        }
        Ok(out)
    }

    /// Creates a file or directory (a file opened for writing by the
    /// creating node), or replaces a file's content (`replace`).
    pub fn create(&self, request: &CreateRequest) -> Result<Entry> {
        let path = NamespacePath::parse(&request.path)?;
        if path.is_root() {
            return Err(F3Error::conflict("/ exists already"));
        }
        self.node(&request.node)?;
        self.write(|files, _| {
            let parent = get(files, path.parent().as_str())?.ok_or_else(|| {
                F3Error::not_found(format!("{}: no such directory in F3", path.parent()))
            })?;
            if !parent.directory {
                return Err(F3Error::invalid(format!(
                    "{} is a file, not a directory",
                    parent.path
                )));
            }
            let now = unix_ms();
            let entry = match get(files, path.as_str())? {
                Some(mut existing)
                    if request.replace && !existing.directory && !request.directory =>
                {
                    existing.size = 0;
                    existing.version += 1;
                    existing.held.clear();
                    // New content: whoever writes it names itself again.
                    existing.producer = None;
                    if existing.ephemeral {
                        existing.holder = Some(request.node.clone());
                    }
                    add_writer(&mut existing, &request.node)?;
                    existing.modified_ms = now;
                    existing
                }
                Some(_) => return Err(F3Error::conflict(format!("{path} exists already"))),
                None => {
                    let mut entry = Entry {
                        path: path.to_string(),
                        directory: request.directory,
                        ephemeral: request.ephemeral,
                        holder: (request.ephemeral && !request.directory)
                            .then(|| request.node.clone()),
                        size: 0,
                        version: 1,
                        writers: BTreeMap::new(),
                        held: BTreeMap::new(),
                        modified_ms: now,
                        producer: None,
                    };
                    if !request.directory {
                        add_writer(&mut entry, &request.node)?;
                    }
                    entry
                }
            };
            put(files, &entry)?;
            Ok(entry)
        })
    }

    /// Removes a file, or an empty directory; returns what it was.
    pub fn remove(&self, path: &NamespacePath) -> Result<Entry> {
        if path.is_root() {
            return Err(F3Error::conflict("/ cannot be removed"));
        }
        if self.stat(path)?.directory && !self.list(path)?.is_empty() {
            return Err(F3Error::conflict(format!("{path}: directory not empty")));
        }
        self.write(|files, _| {
            let old = files
                .remove(path.as_str())
                .map_err(|e| store_error("removing", e))?
                .ok_or_else(|| F3Error::not_found(format!("{path}: no such file in F3")))?;
            decode(path.as_str(), old.value())
        })
    }

    /// A node opened or closed a file for writing.
    pub fn writer(&self, request: &WriterRequest) -> Result<Entry> {
        let path = NamespacePath::parse(&request.path)?;
        self.node(&request.node)?;
        self.update_entry(&path, |entry| {
            if entry.directory {
                return Err(F3Error::invalid(format!("{path} is a directory")));
            }
            if request.opened {
                add_writer(entry, &request.node)?;
                entry.version += 1;
            } else {
                match entry.writers.get_mut(&request.node) {
                    Some(count) if *count > 1 => *count -= 1,
                    Some(_) => {
                        entry.writers.remove(&request.node);
                    }
                    None => {
                        return Err(F3Error::conflict(format!(
                            "{path}: node {} has no writer open to close",
                            request.node
                        )))
                    }
                }
            }
            if let Some(size) = request.size {
                entry.size = size;
                if entry.ephemeral {
                    if let Some(holder) = entry.holder.clone() {
                        entry.held.insert(holder, size);
                    }
                }
            }
            Ok(())
        })
    }

    /// Changes a file's size or tier, or a directory's marking.
    pub fn update(&self, request: &UpdateRequest) -> Result<Entry> {
        let path = NamespacePath::parse(&request.path)?;
        self.update_entry(&path, |entry| {
            if let Some(size) = request.size {
                if entry.directory {
                    return Err(F3Error::invalid(format!(
                        "{path} is a directory: it has no size"
                    )));
                }
                entry.size = size;
                entry.version += 1;
                entry.held.clear();
                if let Some(holder) = entry.holder.clone() {
                    entry.held.insert(holder, size);
                }
            }
            if let Some(ephemeral) = request.ephemeral {
                entry.ephemeral = ephemeral;
            }
            if request.clear_holder {
                entry.holder = None;
            }
            if let Some(producer) = &request.producer {
                check_producer(producer)?;
                entry.producer = (!producer.is_empty()).then(|| producer.clone());
            }
            Ok(())
        })
    }

    /// Records the bytes `node` holds of each file; returns the paths
    /// that do not exist (ignored).
    pub fn report(&self, node: &str, files: &[(NamespacePath, u64)]) -> Result<Vec<String>> {
        self.node(node)?;
        self.write(|table, _| {
            let mut missing = Vec::new();
            for (path, bytes) in files {
                let bytes = *bytes;
                let Some(mut entry) = get(table, path.as_str())? else {
                    missing.push(path.to_string());
                    continue;
                };
                if entry.directory {
                    return Err(F3Error::invalid(format!(
                        "{path} is a directory: a node holds bytes of files only"
                    )));
                }
                if bytes == 0 {
                    entry.held.remove(node);
                } else {
                    entry.held.insert(node.to_string(), bytes);
                }
                put(table, &entry)?;
            }
            Ok(missing)
        })
    }

    /// Nodes by bytes held of `files`, most first; and the files missing.
    pub fn locality(&self, files: &[NamespacePath]) -> Result<(Vec<NodeBytes>, Vec<String>)> {
        let alive: HashMap<String, bool> = self
            .nodes()?
            .into_iter()
            .map(|n| (n.name, n.alive))
            .collect();
        let mut bytes: BTreeMap<String, u64> = BTreeMap::new();
        let mut missing = Vec::new();
        for path in files {
            match self.stat(path) {
                Ok(entry) => {
                    for (node, held) in entry.held {
                        let total = bytes.entry(node).or_default();
                        *total = total.saturating_add(held);
                    }
                }
                Err(e) if e.kind == crate::error::ErrorKind::NotFound => {
                    missing.push(path.to_string())
                }
                Err(e) => return Err(e),
            }
        }
        Ok((
            crate::locality::rank(bytes, |node| alive.get(node).copied().unwrap_or(false)),
            missing,
        ))
    }

    /// Reads the entry at `path`, changes it with `change`, stores it with
    /// a new modification time.
    fn update_entry(
        &self,
        path: &NamespacePath,
        change: impl FnOnce(&mut Entry) -> Result<()>,
    ) -> Result<Entry> {
        self.write(|files, _| {
            let mut entry = get(files, path.as_str())?
                .ok_or_else(|| F3Error::not_found(format!("{path}: no such file in F3")))?;
            change(&mut entry)?;
            entry.modified_ms = unix_ms();
            put(files, &entry)?;
            Ok(entry)
        })
    }

    /// Runs `f` in one write transaction, committed if it succeeds.
    fn write<T>(
        &self,
        f: impl FnOnce(&mut redb::Table<&str, &[u8]>, &mut redb::Table<&str, &str>) -> Result<T>,
    ) -> Result<T> {
        let txn = self
            .database
            .begin_write()
            .map_err(|e| store_error("starting a write", e))?;
        let out = {
            let mut files = txn
                .open_table(FILES)
                .map_err(|e| store_error("opening the files", e))?;
            let mut nodes = txn
                .open_table(NODES)
                .map_err(|e| store_error("opening the nodes", e))?;
            f(&mut files, &mut nodes)?
        };
        txn.commit().map_err(|e| store_error("committing", e))?;
        Ok(out)
    }
}

fn add_writer(entry: &mut Entry, node: &str) -> Result<()> {
    let count = entry.writers.entry(node.to_string()).or_default();
    if *count >= MAX_WRITERS_PER_NODE {
        return Err(F3Error::conflict(format!(
            "{}: node {node} has {MAX_WRITERS_PER_NODE} writers open already",
            entry.path
        )));
    }
    *count += 1;
    Ok(())
}

fn get(
    table: &impl ReadableTable<&'static str, &'static [u8]>,
    path: &str,
) -> Result<Option<Entry>> {
    match table.get(path).map_err(|e| store_error("reading", e))? {
        Some(value) => Ok(Some(decode(path, value.value())?)),
        None => Ok(None),
    }
}

fn put(table: &mut redb::Table<&str, &[u8]>, entry: &Entry) -> Result<()> {
    let bytes = serde_json::to_vec(entry).map_err(|e| store_error("encoding", e))?;
    table
        .insert(entry.path.as_str(), bytes.as_slice())
        .map_err(|e| store_error("writing", e))?;
    Ok(())
}

/// The entry stored under `path`, checked to be that path's.
pub(crate) fn decode(path: &str, bytes: &[u8]) -> Result<Entry> {
    let entry: Entry = serde_json::from_slice(bytes)
        .map_err(|e| store_error(&format!("the record of {path} is unreadable"), e))?;
    if entry.path != path {
        return Err(store_error(
            &format!("the record under {path}"),
            format!("names {}", entry.path),
        ));
    }
    Ok(entry)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn create(
        catalog: &Catalog,
        path: &str,
        directory: bool,
        ephemeral: bool,
        node: &str,
    ) -> Result<Entry> {
        catalog.create(&CreateRequest {
            path: path.into(),
            directory,
            ephemeral,
            node: node.into(),
            replace: false,
        })
    }

    #[test]
    fn files_writers_and_holdings_survive_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        {
            let catalog = Catalog::open(dir.path(), Duration::from_secs(3)).unwrap();
            catalog.heartbeat("a", "127.0.0.1:1").unwrap();
            catalog.heartbeat("b", "127.0.0.1:2").unwrap();
            create(&catalog, "/jobs", true, true, "a").unwrap();
            let entry = create(&catalog, "/jobs/out", false, true, "a").unwrap();
            assert_eq!(entry.holder.as_deref(), Some("a"));
            assert_eq!(entry.writers.get("a"), Some(&1));
            assert!(create(&catalog, "/jobs/out", false, true, "b").is_err());
            assert!(create(&catalog, "/nowhere/x", false, true, "a").is_err());
            assert!(create(&catalog, "/jobs/y", false, true, "ghost").is_err());
            let closed = catalog
                .writer(&WriterRequest {
                    path: "/jobs/out".into(),
                    node: "a".into(),
                    opened: false,
                    size: Some(700),
                })
                .unwrap();
            assert!(closed.writers.is_empty());
            assert_eq!(closed.held.get("a"), Some(&700));
            let out = NamespacePath::parse("/jobs/out").unwrap();
            catalog.report("b", &[(out.clone(), 300)]).unwrap();
            assert!(catalog
                .remove(&NamespacePath::parse("/jobs").unwrap())
                .is_err());
        }
        let catalog = Catalog::open(dir.path(), Duration::from_secs(3)).unwrap();
        let names: Vec<String> = catalog
            .list(&NamespacePath::parse("/jobs").unwrap())
            .unwrap()
            .into_iter()
            .map(|e| e.path)
            .collect();
        assert_eq!(names, ["/jobs/out"]);
        let (nodes, missing) = catalog
            .locality(&[
                NamespacePath::parse("/jobs/out").unwrap(),
                NamespacePath::parse("/gone").unwrap(),
            ])
            .unwrap();
        let ranked: Vec<(&str, u64, bool)> = nodes
            .iter()
            .map(|n| (n.node.as_str(), n.bytes, n.alive))
            .collect();
        // After a restart no lease is current until the next heartbeat.
        assert_eq!(ranked, [("a", 700, false), ("b", 300, false)]);
        assert_eq!(missing, ["/gone"]);
    }
}
