//! A repository behind an HTTP server that honours range requests.

use std::io::Read;
use std::time::Duration;

use super::{parse_peer_list, Repository, MAX_ADDR_LEN, MAX_PEERS, PEERS_SUFFIX};
use crate::{MirrorError, Result};

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
