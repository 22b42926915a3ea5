//! The API's bearer token: 32 random bytes, hex, in `POOL/api.token`.
//!
//! The daemon makes the file at its first start, with `O_EXCL` and mode
//! 0600 given to `open` itself, so the token is never readable by anyone
//! but the owner, not even for an instant. Later starts read it back, and
//! refuse a file others can read (the token may have leaked: delete the
//! file and a new token is made). Clients on the same host read the same
//! file (`strata volume ...` does it by itself).

use std::io::{ErrorKind, Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use crate::error::{Result, VolumeError};

/// Name of the token file in the pool directory.
pub const TOKEN_FILE: &str = "api.token";

/// Random bytes in a token (it is written as twice as many hex digits).
pub const TOKEN_BYTES: usize = 32;

/// The API's bearer token.
#[derive(Clone)]
pub struct ApiToken {
    hex: String,
}

impl std::fmt::Debug for ApiToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the secret itself.
        f.write_str("ApiToken(..)")
    }
}

/// Whether [`ApiToken::load_or_create`] made a new token file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenOrigin {
    /// The file was made now.
    Created,
    /// The file was there from an earlier start.
    Existing,
}

impl ApiToken {
    /// Path of the token file of `pool`.
    pub fn path(pool: &Path) -> PathBuf {
        pool.join(TOKEN_FILE)
    }

    /// Reads the pool's token file, or makes it (mode 0600, `O_EXCL`) if
    /// there is none.
    pub fn load_or_create(pool: &Path) -> Result<(ApiToken, TokenOrigin)> {
        let path = ApiToken::path(pool);
        let created = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path);
        match created {
            Ok(mut file) => {
                let token = ApiToken::random()?;
                file.write_all(format!("{}\n", token.hex).as_bytes())
                    .and_then(|()| file.sync_all())
                    .map_err(|e| {
                        let _ = std::fs::remove_file(&path);
                        VolumeError::Io(format!(
                            "cannot write the API token file {}: {e}",
                            path.display()
                        ))
                    })?;
                Ok((token, TokenOrigin::Created))
            }
            Err(e) if e.kind() == ErrorKind::AlreadyExists => {
                Ok((ApiToken::load(&path)?, TokenOrigin::Existing))
            }
            Err(e) => Err(VolumeError::Io(format!(
                "cannot create the API token file {}: {e}",
                path.display()
            ))),
        }
    }

    /// Reads a token file, refusing one that others than its owner may
    /// read.
    pub fn load(path: &Path) -> Result<ApiToken> {
        let mut file = std::fs::File::open(path).map_err(|e| {
            VolumeError::Io(format!(
                "cannot open the API token file {}: {e}",
                path.display()
            ))
        })?;
        let mode = file
            .metadata()
            .map_err(|e| VolumeError::Io(format!("cannot stat {}: {e}", path.display())))?
            .mode();
        if mode & 0o077 != 0 {
            return Err(VolumeError::Invalid(format!(
                "the API token file {} has mode {:o}: others than its owner may have read \
                 the token; delete the file (a new token is made at the next start) or \
                 `chmod 600` it",
                path.display(),
                mode & 0o777
            )));
        }
        let mut text = String::new();
        Read::by_ref(&mut file)
            .take(4 * TOKEN_BYTES as u64)
            .read_to_string(&mut text)
            .map_err(|e| VolumeError::Io(format!("cannot read {}: {e}", path.display())))?;
        ApiToken::parse(text.trim()).ok_or_else(|| {
            VolumeError::Invalid(format!(
                "the API token file {} does not hold {} hex digits; delete it and a new \
                 token is made at the next start",
                path.display(),
                2 * TOKEN_BYTES
            ))
        })
    }

    /// A token from its hex text, if it is one.
    fn parse(hex: &str) -> Option<ApiToken> {
        let ok = hex.len() == 2 * TOKEN_BYTES && hex.bytes().all(|b| b.is_ascii_hexdigit());
        ok.then(|| ApiToken {
            hex: hex.to_ascii_lowercase(),
        })
    }

    /// A new random token.
    fn random() -> Result<ApiToken> {
        let mut bytes = [0u8; TOKEN_BYTES];
        getrandom::fill(&mut bytes)
            .map_err(|e| VolumeError::Io(format!("no randomness for the API token: {e}")))?;
        Ok(ApiToken {
            hex: bytes.iter().map(|b| format!("{b:02x}")).collect(),
        })
    }

    /// Whether `presented` is this token. Takes the same time wherever the
    /// first difference is, so timing does not reveal how much of a guess
    /// was right.
    pub fn matches(&self, presented: &[u8]) -> bool {
        let expected = self.hex.as_bytes();
        if presented.len() != expected.len() {
            // The length is public (always 64 hex digits).
            return false;
        }
        let difference = expected
            .iter()
            .zip(presented)
            .fold(0u8, |acc, (a, b)| acc | (a ^ b));
        // Keep the compiler from turning the fold into an early exit.
        std::hint::black_box(difference) == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_token_file_is_private_and_read_back_the_same() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (made, origin) = ApiToken::load_or_create(dir.path()).expect("create");
        assert_eq!(origin, TokenOrigin::Created);
        let mode = std::fs::metadata(ApiToken::path(dir.path()))
            .expect("stat")
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        let (read, origin) = ApiToken::load_or_create(dir.path()).expect("load");
        assert_eq!(origin, TokenOrigin::Existing);
        assert!(read.matches(made.hex.as_bytes()));
        assert!(!read.matches(b"nope"));
        let mut wrong = made.hex.clone().into_bytes();
        wrong[63] = if wrong[63] == b'0' { b'1' } else { b'0' };
        assert!(!read.matches(&wrong));
    }

    #[test]
    fn a_token_file_others_can_read_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("tempdir");
        ApiToken::load_or_create(dir.path()).expect("create");
        let path = ApiToken::path(dir.path());
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        let err = ApiToken::load_or_create(dir.path()).expect_err("refused");
        assert!(err.to_string().contains("chmod 600"), "{err}");
    }

    #[test]
    fn a_token_file_without_a_token_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = ApiToken::path(dir.path());
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .and_then(|mut f| f.write_all(b"short\n"))
            .expect("write");
        let err = ApiToken::load(&path).expect_err("refused");
        assert!(err.to_string().contains("hex digits"), "{err}");
    }
}
