//! A repository kept in Strata's object store (`store://ORCHESTRATOR/NAME`).
//!
//! The store serves whole objects, each checked against its CRC-32C by the
//! storage node and the client, so an image is stored as parts:
//!
//! - `NAME.layout`: `strata-image-parts 1`, `part_size=P` and `size=S`
//!   lines (a few dozen bytes);
//! - `NAME/part/NNNNNNNNNN`: part `N`, `P` bytes (the last one shorter);
//! - `NAME.digest`, `NAME.trace`: the side files of any repository;
//! - `NAME.peers/ADDR`: one empty object per mirror, for rendezvous (a
//!   listing of that prefix is the peer list).
//!
//! [`publish`] writes an image in that layout. A read fetches the parts it
//! overlaps and keeps the last few in memory, so neighbouring chunks (the
//! common case: the mirror reads 32 KiB chunks) cost one part fetch.

use std::collections::VecDeque;
use std::future::Future;
use std::io::Read;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use parking_lot::Mutex;
use strata_store_client::client::Client;
use strata_store_protocol::wire::Code;

use super::{parse_peer_list, Repository, MAX_ADDR_LEN, MAX_PEERS, PEERS_SUFFIX};
use crate::digest::{Manifest, SUFFIX as DIGEST_SUFFIX};
use crate::{io_err, MirrorError, Result};

/// URL scheme of store repositories.
pub const SCHEME: &str = "store://";

/// Default part size of a published image.
pub const DEFAULT_PART_SIZE: u64 = 256 * 1024;

/// Part sizes accepted (a layout object naming another is refused).
pub const MIN_PART_SIZE: u64 = 4 * 1024;
/// Largest part size accepted.
pub const MAX_PART_SIZE: u64 = 64 * 1024 * 1024;

/// Parts kept in memory by a reader.
const CACHED_PARTS: usize = 8;

/// Longest layout object read.
const MAX_LAYOUT_BYTES: u64 = 4096;

const LAYOUT_SUFFIX: &str = ".layout";
const LAYOUT_MAGIC: &str = "strata-image-parts 1";

/// Where an image lives in a store: the orchestrator and the object name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreSpec {
    /// The orchestrator's address.
    pub orchestrator: SocketAddr,
    /// The image's name in the store.
    pub name: String,
}

impl StoreSpec {
    /// Parses `store://HOST:PORT/NAME`.
    pub fn parse(spec: &str) -> Result<StoreSpec> {
        let bad = |why: &str| {
            MirrorError::Config(format!(
                "repository '{spec}': {why}; expected store://HOST:PORT/NAME"
            ))
        };
        let rest = spec
            .strip_prefix(SCHEME)
            .ok_or_else(|| bad("not a store:// URL"))?;
        let (host, name) = rest.split_once('/').ok_or_else(|| bad("no object name"))?;
        if name.is_empty() || name.ends_with('/') {
            return Err(bad("empty object name"));
        }
        strata_store_protocol::wire::check_name(name).map_err(|e| bad(&e))?;
        let orchestrator = host
            .parse()
            .map_err(|_| bad(&format!("'{host}' is not an address and port")))?;
        Ok(StoreSpec {
            orchestrator,
            name: name.to_string(),
        })
    }

    fn part_name(&self, index: u64) -> String {
        format!("{}/part/{index:010}", self.name)
    }

    fn sidecar(&self, suffix: &str) -> String {
        format!("{}{suffix}", self.name)
    }
}

/// Runs store calls from synchronous code on a private runtime.
struct Runner {
    rt: tokio::runtime::Runtime,
}

impl Runner {
    fn new() -> Result<Runner> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("strata-store-repo")
            .enable_all()
            .build()
            .map_err(io_err("cannot start the object-store client runtime"))?;
        Ok(Runner { rt })
    }

    /// Runs `f` to completion. From inside another runtime (where
    /// `block_on` is not allowed) it runs on a helper thread.
    fn run<T: Send>(&self, f: impl Future<Output = T> + Send) -> T {
        if tokio::runtime::Handle::try_current().is_err() {
            return self.rt.block_on(f);
        }
        std::thread::scope(|s| {
            s.spawn(|| self.rt.block_on(f))
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
        })
    }
}

/// An image in the object store, read part by part.
pub struct StoreRepo {
    spec: StoreSpec,
    runner: Runner,
    client: Client,
    part_size: u64,
    size: u64,
    cache: Mutex<VecDeque<(u64, Arc<Vec<u8>>)>>,
}

impl std::fmt::Debug for StoreRepo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreRepo")
            .field("spec", &self.spec)
            .field("part_size", &self.part_size)
            .field("size", &self.size)
            .finish_non_exhaustive()
    }
}

impl StoreRepo {
    /// Connects to the store and reads the image's layout.
    pub fn open(spec: &str) -> Result<StoreRepo> {
        let spec = StoreSpec::parse(spec)?;
        let runner = Runner::new()?;
        // The tenant's credential comes from STRATA_CREDENTIAL: the store
        // takes only sealed metadata requests.
        let credential = strata_store_protocol::tenant::TenantCredential::from_env()
            .map_err(|e| repo_err(&spec, e.report().to_string()))?;
        let client = runner
            .run(Client::connect(spec.orchestrator, credential))
            .map_err(|e| repo_err(&spec, format!("cannot reach the store: {}", e.report())))?;
        let mut repo = StoreRepo {
            spec,
            runner,
            client,
            part_size: 0,
            size: 0,
            cache: Mutex::new(VecDeque::new()),
        };
        let layout = repo
            .get_object(&repo.spec.sidecar(LAYOUT_SUFFIX), MAX_LAYOUT_BYTES)?
            .ok_or_else(|| {
                repo_err(
                    &repo.spec,
                    format!(
                        "no image named '{}' (no {LAYOUT_SUFFIX} object); publish it with \
                         `strata mirror publish`",
                        repo.spec.name
                    ),
                )
            })?;
        (repo.part_size, repo.size) = parse_layout(&layout).map_err(|e| repo_err(&repo.spec, e))?;
        Ok(repo)
    }

    /// An object's bytes, `None` if it does not exist; longer than `max`
    /// is an error (checked before reading it).
    fn get_object(&self, name: &str, max: u64) -> Result<Option<Vec<u8>>> {
        let result = self.runner.run(async {
            let record = match self.client.stat(name).await {
                Ok(r) => r,
                Err(e) if matches!(e.code(), Some(Code::NotFound | Code::Deleted)) => {
                    return Ok(None)
                }
                Err(e) => return Err(e.report().to_string()),
            };
            if record.size > max {
                return Err(format!(
                    "object '{name}' is {} bytes, more than the {max} expected",
                    record.size
                ));
            }
            match self.client.get_bytes(name).await {
                Ok((_, bytes)) => Ok(Some(bytes)),
                Err(e) => Err(e.report().to_string()),
            }
        });
        result.map_err(|e| repo_err(&self.spec, e))
    }

    fn put_object(&self, name: &str, data: &[u8]) -> Result<()> {
        put_object(&self.runner, &self.client, &self.spec, name, data)
    }

    /// Part `index`, from the cache or the store.
    fn part(&self, index: u64) -> Result<Arc<Vec<u8>>> {
        if let Some((_, p)) = self.cache.lock().iter().find(|(i, _)| *i == index) {
            return Ok(p.clone());
        }
        let want = self.part_len(index);
        let name = self.spec.part_name(index);
        let bytes = self
            .get_object(&name, want)?
            .ok_or_else(|| repo_err(&self.spec, format!("part '{name}' is missing")))?;
        if bytes.len() as u64 != want {
            return Err(repo_err(
                &self.spec,
                format!("part '{name}' is {} bytes, expected {want}", bytes.len()),
            ));
        }
        let part = Arc::new(bytes);
        let mut cache = self.cache.lock();
        cache.push_front((index, part.clone()));
        cache.truncate(CACHED_PARTS);
        Ok(part)
    }

    fn part_len(&self, index: u64) -> u64 {
        self.part_size
            .min(self.size.saturating_sub(index * self.part_size))
    }
}

/// Stores `data` as object `name`.
fn put_object(
    runner: &Runner,
    client: &Client,
    spec: &StoreSpec,
    name: &str,
    data: &[u8],
) -> Result<()> {
    runner
        .run(client.put(name, data.len() as u64, &mut &data[..], &|_| {}))
        .map(|_| ())
        .map_err(|e| repo_err(spec, format!("cannot store '{name}': {}", e.report())))
}

fn repo_err(spec: &StoreSpec, detail: String) -> MirrorError {
    MirrorError::Repo {
        repo: format!("{SCHEME}{}/{}", spec.orchestrator, spec.name),
        detail,
    }
}

/// Parses a layout object: (part size, image size).
fn parse_layout(bytes: &[u8]) -> std::result::Result<(u64, u64), String> {
    let text = std::str::from_utf8(bytes).map_err(|_| "layout object is not text".to_string())?;
    let mut lines = text.lines();
    if lines.next() != Some(LAYOUT_MAGIC) {
        return Err(format!(
            "layout object does not start with '{LAYOUT_MAGIC}'"
        ));
    }
    let (mut part, mut size) = (None, None);
    for line in lines {
        match line.split_once('=') {
            Some(("part_size", v)) => part = v.trim().parse::<u64>().ok(),
            Some(("size", v)) => size = v.trim().parse::<u64>().ok(),
            _ => {}
        }
    }
    let (Some(part), Some(size)) = (part, size) else {
        return Err("layout object lacks part_size or size".into());
    };
    if !(MIN_PART_SIZE..=MAX_PART_SIZE).contains(&part) {
        return Err(format!(
            "part size {part} outside {MIN_PART_SIZE}..={MAX_PART_SIZE}"
        ));
    }
    Ok((part, size))
}

fn layout_text(part_size: u64, size: u64) -> String {
    format!("{LAYOUT_MAGIC}\npart_size={part_size}\nsize={size}\n")
}

impl Repository for StoreRepo {
    fn describe(&self) -> String {
        format!("{SCHEME}{}/{}", self.spec.orchestrator, self.spec.name)
    }

    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        let end = offset
            .checked_add(buf.len() as u64)
            .filter(|&e| e <= self.size)
            .ok_or_else(|| {
                repo_err(
                    &self.spec,
                    format!(
                        "read of {} bytes at {offset} past the image's {} bytes",
                        buf.len(),
                        self.size
                    ),
                )
            })?;
        let mut pos = offset;
        while pos < end {
            let index = pos / self.part_size;
            let part = self.part(index)?;
            let in_part = (pos - index * self.part_size) as usize;
            let n = ((end - pos) as usize).min(part.len() - in_part);
            let at = (pos - offset) as usize;
            buf[at..at + n].copy_from_slice(&part[in_part..in_part + n]);
            pos += n as u64;
        }
        Ok(())
    }

    fn get_sidecar(&self, suffix: &str, max: u64) -> Result<Option<Vec<u8>>> {
        self.get_object(&self.spec.sidecar(suffix), max)
    }

    fn put_sidecar(&self, suffix: &str, data: &[u8]) -> Result<()> {
        self.put_object(&self.spec.sidecar(suffix), data)
    }

    fn rendezvous(&self, me: &str) -> Result<Vec<String>> {
        if me.is_empty() || me.len() > MAX_ADDR_LEN || me.contains('/') {
            return Err(MirrorError::Config(format!(
                "peer address '{me}' cannot be recorded in the store"
            )));
        }
        let prefix = format!("{}{PEERS_SUFFIX}/", self.spec.name);
        self.put_object(&format!("{prefix}{me}"), &[])?;
        let listed = self.runner.run(async {
            let mut names = Vec::new();
            let mut after = String::new();
            loop {
                let (page, next) = self.client.list(&prefix, &after, 1000).await?;
                names.extend(page.into_iter().map(|e| e.name));
                match next {
                    Some(n) if names.len() < MAX_PEERS => after = n,
                    _ => return Ok::<_, strata_store_protocol::Error>(names),
                }
            }
        });
        let names = listed
            .map_err(|e| repo_err(&self.spec, format!("cannot list peers: {}", e.report())))?;
        let text: String = names
            .iter()
            .filter_map(|n| n.strip_prefix(&prefix))
            .map(|a| format!("{a}\n"))
            .collect();
        Ok(parse_peer_list(&text))
    }
}

/// What [`publish`] stored.
#[derive(Debug, Clone, serde::Serialize)]
pub struct PublishReport {
    /// Where, as a repository URL for `strata mirror --repo`.
    pub repo: String,
    /// Image size in bytes.
    pub size: u64,
    /// Part size in bytes.
    pub part_size: u64,
    /// Parts stored.
    pub parts: u64,
    /// Chunks in the digest manifest.
    pub chunks: u32,
}

/// Stores the image file `image` in the store as `spec` describes (parts,
/// layout, digest manifest of `chunk_size` chunks), replacing any earlier
/// image of that name. `progress` is told the bytes stored so far.
pub fn publish(
    image: &Path,
    spec: &str,
    part_size: u64,
    chunk_size: u32,
    mut progress: impl FnMut(u64),
) -> Result<PublishReport> {
    let spec = StoreSpec::parse(spec)?;
    if !(MIN_PART_SIZE..=MAX_PART_SIZE).contains(&part_size) {
        return Err(MirrorError::Config(format!(
            "part size {part_size} is outside {MIN_PART_SIZE}..={MAX_PART_SIZE} bytes"
        )));
    }
    let manifest = Manifest::compute(image, chunk_size, |_| {})?;
    let runner = Runner::new()?;
    // The tenant's credential comes from STRATA_CREDENTIAL: the store
    // takes only sealed metadata requests.
    let credential = strata_store_protocol::tenant::TenantCredential::from_env()
        .map_err(|e| repo_err(&spec, e.report().to_string()))?;
    let client = runner
        .run(Client::connect(spec.orchestrator, credential))
        .map_err(|e| repo_err(&spec, format!("cannot reach the store: {}", e.report())))?;
    let mut file =
        std::fs::File::open(image).map_err(io_err(format!("cannot open '{}'", image.display())))?;
    let size = manifest.image_size;
    let parts = size.div_ceil(part_size);
    let mut buf = vec![0u8; part_size as usize];
    for index in 0..parts {
        let len = part_size.min(size - index * part_size) as usize;
        file.read_exact(&mut buf[..len])
            .map_err(io_err(format!("cannot read '{}'", image.display())))?;
        put_object(&runner, &client, &spec, &spec.part_name(index), &buf[..len])?;
        progress(index * part_size + len as u64);
    }
    let put_small = |suffix: &str, data: &[u8]| {
        put_object(&runner, &client, &spec, &spec.sidecar(suffix), data)
    };
    put_small(DIGEST_SUFFIX, &manifest.encode())?;
    // The layout last: a reader that finds it finds every part.
    put_small(LAYOUT_SUFFIX, layout_text(part_size, size).as_bytes())?;
    Ok(PublishReport {
        repo: format!("{SCHEME}{}/{}", spec.orchestrator, spec.name),
        size,
        part_size,
        parts,
        chunks: manifest.chunks(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse_and_bad_ones_say_why() {
        let s = StoreSpec::parse("store://127.0.0.1:7480/images/base").unwrap();
        assert_eq!(s.orchestrator, "127.0.0.1:7480".parse().unwrap());
        assert_eq!(s.name, "images/base");
        assert_eq!(s.part_name(3), "images/base/part/0000000003");
        for bad in [
            "store://127.0.0.1:7480",
            "store://127.0.0.1:7480/",
            "store://nohost/x",
            "http://127.0.0.1:1/x",
        ] {
            let e = StoreSpec::parse(bad).unwrap_err().to_string();
            assert!(e.contains("expected store://HOST:PORT/NAME"), "{bad}: {e}");
        }
    }

    #[test]
    fn layouts_round_trip_and_hostile_ones_are_refused() {
        let text = layout_text(65536, 1_000_000);
        assert_eq!(parse_layout(text.as_bytes()), Ok((65536, 1_000_000)));
        assert!(parse_layout(b"garbage").is_err());
        assert!(parse_layout(b"strata-image-parts 1\nsize=10\n").is_err());
        // A part size that would make readers allocate without bound.
        let huge = layout_text(1 << 40, 1 << 41);
        assert!(parse_layout(huge.as_bytes())
            .unwrap_err()
            .contains("part size"));
        assert!(parse_layout(&[0xff, 0xfe]).is_err());
    }
}
