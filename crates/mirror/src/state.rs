//! The mirror's files in its directory: `image.raw`, the mirror itself
//! (sparse, the image's size), and `chunks.state`, the chunk-state map.
//!
//! The map is a 44-byte header (magic `STRSTAT1`, the image id, the chunk
//! count) and one byte per chunk ([`ChunkState::to_byte`]). It is written
//! after the chunk's data, and both are synced on flush. At start the map
//! is only a hint for image chunks: each one it lists as held is checked
//! against the manifest again, so a crash between data and map costs a
//! refetch of that chunk, never wrong data. Written chunks cannot be
//! checked (they are this host's data) and are kept as the map says.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::chunk::ChunkState;
use crate::digest::Manifest;
use crate::{io_err, MirrorError, Result};

/// Magic of the state map.
pub const MAGIC: &[u8; 8] = b"STRSTAT1";
const HEADER_LEN: u64 = 44;
/// Name of the mirror file in the directory.
pub const IMAGE_FILE: &str = "image.raw";
/// Name of the state map in the directory.
pub const STATE_FILE: &str = "chunks.state";

/// The open mirror file and state map.
#[derive(Debug)]
pub struct Store {
    /// The mirror file.
    pub image: File,
    /// Its path.
    pub image_path: PathBuf,
    map: File,
    map_path: PathBuf,
    /// The mirror file's write lock, taken as QEMU takes it: no other
    /// mirror, qemu-io or qemu-nbd may write it while this one serves it.
    _lock: strata_disk::ImageLock,
}

impl Store {
    /// Opens (or creates) the files in `dir` for `manifest`; returns the
    /// store and the states recorded (all `Remote` for a new mirror, or
    /// one made for another image, which is then emptied).
    pub fn open(dir: &Path, manifest: &Manifest) -> Result<(Store, Vec<ChunkState>)> {
        std::fs::create_dir_all(dir)
            .map_err(io_err(format!("cannot create '{}'", dir.display())))?;
        let image_path = dir.join(IMAGE_FILE);
        let map_path = dir.join(STATE_FILE);
        let open = |p: &Path| {
            OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(p)
                .map_err(io_err(format!("cannot open '{}'", p.display())))
        };
        let image = open(&image_path)?;
        // Before anything reads or writes: a second mirror of the same
        // directory is refused without touching a byte.
        let lock =
            strata_disk::ImageLock::acquire(&image, &image_path, strata_disk::LockMode::Write)
                .map_err(|e| {
                    MirrorError::Invalid(format!(
                        "{e} (is another mirror using '{}'?)",
                        dir.display()
                    ))
                })?;
        let map = open(&map_path)?;
        let n = manifest.chunks() as usize;
        let mut header = vec![0u8; HEADER_LEN as usize];
        header[..8].copy_from_slice(MAGIC);
        header[8..40].copy_from_slice(&manifest.id());
        header[40..44].copy_from_slice(&(n as u32).to_be_bytes());

        let mut stored = vec![0u8; HEADER_LEN as usize + n];
        let len = map
            .metadata()
            .map_err(io_err(format!("cannot stat '{}'", map_path.display())))?
            .len();
        let states = if len == stored.len() as u64 {
            map.read_exact_at(&mut stored, 0)
                .map_err(io_err(format!("cannot read '{}'", map_path.display())))?;
            if stored[..HEADER_LEN as usize] == header[..] {
                Some(Self::parse(&stored[HEADER_LEN as usize..], &map_path)?)
            } else {
                None
            }
        } else {
            None
        };
        let states = match states {
            Some(s) => s,
            None => {
                // New, or made for another image: start empty.
                image
                    .set_len(0)
                    .and_then(|_| image.set_len(manifest.image_size))
                    .map_err(io_err(format!("cannot size '{}'", image_path.display())))?;
                let mut fresh = header;
                fresh.resize(HEADER_LEN as usize + n, 0);
                map.set_len(0)
                    .and_then(|_| map.write_all_at(&fresh, 0))
                    .and_then(|_| map.sync_all())
                    .map_err(io_err(format!("cannot write '{}'", map_path.display())))?;
                vec![ChunkState::Remote; n]
            }
        };
        Ok((
            Store {
                image,
                image_path,
                map,
                map_path,
                _lock: lock,
            },
            states,
        ))
    }

    fn parse(bytes: &[u8], path: &Path) -> Result<Vec<ChunkState>> {
        bytes
            .iter()
            .enumerate()
            .map(|(i, b)| {
                ChunkState::from_byte(*b).ok_or_else(|| {
                    MirrorError::Invalid(format!(
                        "'{}': chunk {i} has unknown state byte {b}; delete the mirror directory to start over",
                        path.display()
                    ))
                })
            })
            .collect()
    }

    /// Records the state of chunk `c`.
    pub fn set(&self, c: u32, state: ChunkState) -> Result<()> {
        self.map
            .write_all_at(&[state.to_byte()], HEADER_LEN + c as u64)
            .map_err(io_err(format!(
                "cannot write '{}'",
                self.map_path.display()
            )))
    }

    /// Makes data and map durable, data first.
    pub fn sync(&self) -> Result<()> {
        self.image.sync_data().map_err(io_err(format!(
            "cannot sync '{}'",
            self.image_path.display()
        )))?;
        self.map
            .sync_data()
            .map_err(io_err(format!("cannot sync '{}'", self.map_path.display())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manifest(id_byte: u8) -> Manifest {
        Manifest {
            image_size: 3 * 4096,
            chunk_size: 4096,
            digests: vec![[id_byte; 32]; 3],
        }
    }

    #[test]
    fn states_survive_reopen_and_reset_for_another_image() {
        let dir = tempfile::tempdir().unwrap();
        let (s, states) = Store::open(dir.path(), &manifest(1)).unwrap();
        assert_eq!(states, vec![ChunkState::Remote; 3]);
        s.set(1, ChunkState::Written).unwrap();
        s.set(2, ChunkState::Fetching).unwrap();
        drop(s);
        let (_, states) = Store::open(dir.path(), &manifest(1)).unwrap();
        assert_eq!(
            states,
            vec![ChunkState::Remote, ChunkState::Written, ChunkState::Remote]
        );
        let (_, states) = Store::open(dir.path(), &manifest(2)).unwrap();
        assert_eq!(states, vec![ChunkState::Remote; 3]);
    }

    #[test]
    fn unknown_state_byte_is_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        drop(Store::open(dir.path(), &manifest(1)).unwrap());
        let map = dir.path().join(STATE_FILE);
        let mut bytes = std::fs::read(&map).unwrap();
        bytes[HEADER_LEN as usize] = 77;
        std::fs::write(&map, bytes).unwrap();
        let e = Store::open(dir.path(), &manifest(1))
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown state byte 77"), "{e}");
    }
}
