//! Validation of names and sizes that come from API requests.

use crate::error::{Result, VolumeError};

/// Longest volume or snapshot name.
pub const MAX_NAME_LEN: usize = 64;

/// Largest volume size: 64 TiB (a qcow2 L1 table with 64 KiB clusters
/// covers far more; this bounds what one request can ask the pool for).
pub const MAX_VOLUME_SIZE: u64 = 64 << 40;

/// Checks a volume or snapshot name: 1 to 64 characters of `a-z`, `A-Z`,
/// `0-9`, `.`, `_` and `-`, starting with a letter or digit. Names become
/// NBD export names and URL path segments, so nothing else is allowed.
pub fn check_name(kind: &str, name: &str) -> Result<()> {
    let ok_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-');
    let starts_ok = name
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphanumeric());
    if name.is_empty() || name.len() > MAX_NAME_LEN || !starts_ok || !name.chars().all(ok_char) {
        return Err(VolumeError::Invalid(format!(
            "invalid {kind} name '{}': use 1 to {MAX_NAME_LEN} letters, digits, '.', '_' or '-', \
             starting with a letter or digit",
            name.escape_default()
        )));
    }
    Ok(())
}

/// Checks a volume size: a positive multiple of 512 bytes, at most 64 TiB.
pub fn check_size(size: u64) -> Result<()> {
    if size == 0 || !size.is_multiple_of(512) {
        return Err(VolumeError::Invalid(format!(
            "invalid size {size}: give a positive multiple of 512 bytes"
        )));
    }
    if size > MAX_VOLUME_SIZE {
        return Err(VolumeError::Invalid(format!(
            "size {size} is larger than the limit of {MAX_VOLUME_SIZE} bytes (64 TiB)"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        for good in ["a", "vol-1", "db.data_2", &"x".repeat(64)] {
            assert!(check_name("volume", good).is_ok(), "{good}");
        }
        for bad in [
            "",
            "-a",
            ".a",
            "a/b",
            "a@b",
            "a b",
            "é",
            &"x".repeat(65),
            "a\0",
        ] {
            assert!(check_name("volume", bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn sizes() {
        assert!(check_size(1 << 30).is_ok());
        assert!(check_size(0).is_err());
        assert!(check_size(1000).is_err());
        assert!(check_size(MAX_VOLUME_SIZE + 512).is_err());
        assert!(check_size(u64::MAX - 511).is_err());
    }
}
