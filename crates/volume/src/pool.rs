//! Where a pool keeps its files, and the names of new ones:
//! `POOL/catalog.redb`, `POOL/layers/<id>.qcow2` and `POOL/trash/`
//! (`POOL/api.token` is [`crate::auth::TOKEN_FILE`]).

use std::path::{Path, PathBuf};

use crate::error::{Result, VolumeError};

/// The catalog database.
pub fn catalog(pool: &Path) -> PathBuf {
    pool.join("catalog.redb")
}

/// The folder of layer files.
pub fn layers(pool: &Path) -> PathBuf {
    pool.join("layers")
}

/// The folder of layer files on their way out.
pub fn trash(pool: &Path) -> PathBuf {
    pool.join("trash")
}

/// File name of a layer.
pub fn layer_file(id: &str) -> String {
    format!("{id}.qcow2")
}

/// A new layer id: 32 random hex digits.
pub(crate) fn new_id() -> Result<String> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes)
        .map_err(|e| VolumeError::Io(format!("no randomness for a layer id: {e}")))?;
    Ok(bytes.iter().map(|x| format!("{x:02x}")).collect())
}
