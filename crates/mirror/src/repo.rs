//! Repositories: where the image and its side files (the chunk manifest,
//! the access trace, the rendezvous list) live.
//!
//! Two exist: a file path (local or a network file system) and an HTTP
//! server with range reads (`strata mirror repo-serve`, or any server that
//! answers `Range:` with 206). The object store of Strata plugs in as a
//! third implementation of [`Repository`] once it exists.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::time::Duration;

use crate::{io_err, MirrorError, Result};

/// Side file suffixes a repository may hold next to the image.
pub const SIDECARS: [&str; 3] = [crate::digest::SUFFIX, TRACE_SUFFIX, PEERS_SUFFIX];
/// Suffix of the recorded first-read trace.
pub const TRACE_SUFFIX: &str = ".trace";
/// Suffix of the rendezvous list.
pub const PEERS_SUFFIX: &str = ".peers";
/// Longest peer address accepted at rendezvous.
pub const MAX_ADDR_LEN: usize = 128;
/// Most peers a rendezvous list returns.
pub const MAX_PEERS: usize = 4096;

/// Where an image lives. Reads are blocking: they run on the NBD server's
/// worker threads and the mirror's prefetch threads.
pub trait Repository: Send + Sync + std::fmt::Debug {
    /// The repository as the user named it, for messages.
    fn describe(&self) -> String;

    /// Fills `buf` with image bytes from `offset`.
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<()>;

    /// The side file `IMAGE{suffix}`, if it exists; longer than `max`
    /// bytes is an error.
    fn get_sidecar(&self, suffix: &str, max: u64) -> Result<Option<Vec<u8>>>;

    /// Stores the side file `IMAGE{suffix}` (replacing it).
    fn put_sidecar(&self, suffix: &str, data: &[u8]) -> Result<()>;

    /// Rendezvous: records `me` (a peer address) as a mirror of this image
    /// and returns every address recorded so far, `me` included.
    fn rendezvous(&self, me: &str) -> Result<Vec<String>>;
}

/// Opens `spec`: an `http://` URL, a `store://HOST:PORT/NAME` image in
/// the object store, or a file path.
pub fn open(spec: &str) -> Result<Box<dyn Repository>> {
    if spec.starts_with("http://") {
        Ok(Box::new(HttpRepo::new(spec)))
    } else if spec.starts_with(crate::store_repo::SCHEME) {
        Ok(Box::new(crate::store_repo::StoreRepo::open(spec)?))
    } else if spec.contains("://") {
        Err(MirrorError::Config(format!(
            "repository '{spec}': only http://, store:// URLs and file paths are supported"
        )))
    } else {
        let path = PathBuf::from(spec);
        let file =
            File::open(&path).map_err(io_err(format!("cannot open repository image '{spec}'")))?;
        Ok(Box::new(FileRepo { path, file }))
    }
}

/// Parses a rendezvous list: one address per line, bounded.
pub fn parse_peer_list(text: &str) -> Vec<String> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && l.len() <= MAX_ADDR_LEN)
        .take(MAX_PEERS)
        .map(String::from)
        .collect()
}

/// An image in a file.
#[derive(Debug)]
pub struct FileRepo {
    path: PathBuf,
    file: File,
}

impl FileRepo {
    fn sidecar(&self, suffix: &str) -> PathBuf {
        let mut s = self.path.clone().into_os_string();
        s.push(suffix);
        PathBuf::from(s)
    }
}

impl Repository for FileRepo {
    fn describe(&self) -> String {
        self.path.display().to_string()
    }

    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.file.read_exact_at(buf, offset).map_err(io_err(format!(
            "repository {}: cannot read {} bytes at {offset}",
            self.describe(),
            buf.len()
        )))
    }

    fn get_sidecar(&self, suffix: &str, max: u64) -> Result<Option<Vec<u8>>> {
        let path = self.sidecar(suffix);
        let file = match File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io_err(format!("cannot open '{}'", path.display()))(e)),
        };
        let mut data = Vec::new();
        file.take(max + 1)
            .read_to_end(&mut data)
            .map_err(io_err(format!("cannot read '{}'", path.display())))?;
        if data.len() as u64 > max {
            return Err(MirrorError::Invalid(format!(
                "'{}' is longer than {max} bytes",
                path.display()
            )));
        }
        Ok(Some(data))
    }

    fn put_sidecar(&self, suffix: &str, data: &[u8]) -> Result<()> {
        // Write aside and rename: readers see the old or the new file whole.
        let path = self.sidecar(suffix);
        let tmp = self.sidecar(&format!("{suffix}.tmp{}", std::process::id()));
        std::fs::write(&tmp, data).map_err(io_err(format!("cannot write '{}'", tmp.display())))?;
        std::fs::rename(&tmp, &path)
            .map_err(io_err(format!("cannot rename to '{}'", path.display())))
    }

    fn rendezvous(&self, me: &str) -> Result<Vec<String>> {
        // One line appended per mirror; O_APPEND keeps concurrent lines whole.
        let path = self.sidecar(PEERS_SUFFIX);
        let mut f = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(io_err(format!("cannot open '{}'", path.display())))?;
        f.write_all(format!("{me}\n").as_bytes())
            .map_err(io_err(format!("cannot append to '{}'", path.display())))?;
        let data = self
            .get_sidecar(PEERS_SUFFIX, (MAX_PEERS * (MAX_ADDR_LEN + 1)) as u64)?
            .unwrap_or_default();
        Ok(parse_peer_list(&String::from_utf8_lossy(&data)))
    }
}

/// An image behind an HTTP server that honours range requests.
#[derive(Debug)]
pub struct HttpRepo {
    url: String,
    agent: ureq::Agent,
}

impl HttpRepo {
    /// A repository at `url` (`http://host:port/path`).
    pub fn new(url: &str) -> Self {
        let agent = ureq::AgentBuilder::new()
            .timeout_connect(Duration::from_secs(5))
            .timeout(Duration::from_secs(120))
            .build();
        HttpRepo {
            url: url.to_string(),
            agent,
        }
    }

    fn err(&self, detail: String) -> MirrorError {
        MirrorError::Repo {
            repo: self.url.clone(),
            detail,
        }
    }
}

impl Repository for HttpRepo {
    fn describe(&self) -> String {
        self.url.clone()
    }

    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        if buf.is_empty() {
            return Ok(());
        }
        let range = format!("bytes={}-{}", offset, offset + buf.len() as u64 - 1);
        // A busy server (503) or a dropped connection is retried a few
        // times with backoff before the read fails.
        let mut attempt = 0;
        let resp = loop {
            match self.agent.get(&self.url).set("Range", &range).call() {
                Ok(r) => break r,
                Err(ureq::Error::Status(code, _)) if code != 503 || attempt >= 4 => {
                    return Err(self.err(format!("GET {range}: status {code}")));
                }
                Err(e) if attempt >= 4 => return Err(self.err(format!("GET {range}: {e}"))),
                Err(_) => {
                    std::thread::sleep(Duration::from_millis(50 << attempt));
                    attempt += 1;
                }
            }
        };
        if resp.status() != 206 {
            return Err(self.err(format!(
                "GET {range} answered {} instead of 206: the server must support range requests",
                resp.status()
            )));
        }
        let mut got = Vec::with_capacity(buf.len());
        resp.into_reader()
            .take(buf.len() as u64 + 1)
            .read_to_end(&mut got)
            .map_err(|e| self.err(format!("GET {range}: {e}")))?;
        if got.len() != buf.len() {
            return Err(self.err(format!(
                "GET {range} returned {} bytes, expected {}",
                got.len(),
                buf.len()
            )));
        }
        buf.copy_from_slice(&got);
        Ok(())
    }

    fn get_sidecar(&self, suffix: &str, max: u64) -> Result<Option<Vec<u8>>> {
        let url = format!("{}{suffix}", self.url);
        let resp = match self.agent.get(&url).call() {
            Ok(r) => r,
            Err(ureq::Error::Status(404, _)) => return Ok(None),
            Err(e) => return Err(self.err(format!("GET {url}: {e}"))),
        };
        let mut data = Vec::new();
        resp.into_reader()
            .take(max + 1)
            .read_to_end(&mut data)
            .map_err(|e| self.err(format!("GET {url}: {e}")))?;
        if data.len() as u64 > max {
            return Err(self.err(format!("{url} is longer than {max} bytes")));
        }
        Ok(Some(data))
    }

    fn put_sidecar(&self, suffix: &str, data: &[u8]) -> Result<()> {
        let url = format!("{}{suffix}", self.url);
        self.agent
            .put(&url)
            .send_bytes(data)
            .map_err(|e| self.err(format!("PUT {url}: {e}")))?;
        Ok(())
    }

    fn rendezvous(&self, me: &str) -> Result<Vec<String>> {
        let url = format!("{}{PEERS_SUFFIX}", self.url);
        let resp = self
            .agent
            .post(&url)
            .send_string(me)
            .map_err(|e| self.err(format!("POST {url}: {e}")))?;
        let mut data = Vec::new();
        resp.into_reader()
            .take((MAX_PEERS * (MAX_ADDR_LEN + 1)) as u64)
            .read_to_end(&mut data)
            .map_err(|e| self.err(format!("POST {url}: {e}")))?;
        Ok(parse_peer_list(&String::from_utf8_lossy(&data)))
    }
}
