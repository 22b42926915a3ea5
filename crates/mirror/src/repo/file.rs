//! A repository that is a file: the image at its path, each side file
//! beside it (`IMAGE.digest`, `IMAGE.trace`, `IMAGE.peers`).

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::FileExt;
use std::path::PathBuf;

use super::{parse_peer_list, Repository, MAX_ADDR_LEN, MAX_PEERS, PEERS_SUFFIX};
use crate::{io_err, MirrorError, Result};

/// An image in a file.
#[derive(Debug)]
pub struct FileRepo {
    path: PathBuf,
    file: File,
}

impl FileRepo {
    /// The image at `path`, opened for reading.
    pub fn open(path: &str) -> Result<FileRepo> {
        let file =
            File::open(path).map_err(io_err(format!("cannot open repository image '{path}'")))?;
        Ok(FileRepo {
            path: PathBuf::from(path),
            file,
        })
    }

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
