//! The cluster key: a keyring read from its files, the seals' tags made
//! with it, and the secrets derived from it.

use crate::codec::{Reader, WireError, Writer};
use crate::error::Error;
use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

/// Length of a cluster key, in bytes.
pub const KEY_LEN: usize = 32;

/// Length of a message's tag (HMAC-SHA256 truncated).
pub const TAG_LEN: usize = 16;

/// Name of the key file in the cluster's directory.
pub const KEY_FILE: &str = "cluster.key";

/// How far a seal's clock may be from the receiver's, either way. Nodes'
/// clocks must agree to within this (NTP does much better).
pub const WINDOW_MS: u64 = 60_000;

/// Suffix of the file, next to the key file, holding the next key of a
/// rotation (accepted, not used to seal).
pub const NEXT_SUFFIX: &str = ".next";

/// Suffix of the file, next to the key file, holding the previous key of
/// a rotation (accepted, not used to seal).
pub const PREV_SUFFIX: &str = ".prev";

/// The file next to the key file `path` with `suffix` appended to its
/// name (`cluster.key` gives `cluster.key.next`).
pub fn sibling(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_os_string();
    name.push(suffix);
    PathBuf::from(name)
}

/// Domain-separation prefix of a key's fingerprint ([`fingerprint`]).
const FINGERPRINT_DOMAIN: &[u8] = b"strata store cluster key fingerprint v1\0";

/// A key's fingerprint: the first 8 bytes, big-endian, of SHA-256 over
/// a fixed domain-separation prefix and the key. It names a key without
/// revealing it (nor any HMAC under it), so nodes publish theirs.
pub fn fingerprint(key: &[u8; KEY_LEN]) -> u64 {
    use sha2::Digest;
    let mut hash = Sha256::new();
    hash.update(FINGERPRINT_DOMAIN);
    hash.update(key);
    let full = hash.finalize();
    let mut first = [0u8; 8];
    first.copy_from_slice(&full[..8]);
    u64::from_be_bytes(first)
}

/// A fingerprint as shown: 16 lowercase hex digits.
pub fn fmt_fingerprint(fp: u64) -> String {
    format!("{fp:016x}")
}

/// The fingerprints of a keyring ([`ClusterKey::fingerprints`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fingerprints {
    /// The active key's, which seals.
    pub active: u64,
    /// The other accepted key's (next or previous), if there is one.
    pub other: Option<u64>,
}

impl std::fmt::Display for Fingerprints {
    /// `active` or `active+other`, in hex.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", fmt_fingerprint(self.active))?;
        if let Some(o) = self.other {
            write!(f, "+{}", fmt_fingerprint(o))?;
        }
        Ok(())
    }
}

/// The keys a node holds, each keyed into HMAC-SHA256 once.
struct Ring {
    /// Seals messages and tickets.
    active: Hmac<Sha256>,
    /// Also accepted (the next or the previous key of a rotation).
    other: Option<Hmac<Sha256>>,
    /// The fingerprints of the two.
    prints: Fingerprints,
}

impl Ring {
    fn new(active: &[u8; KEY_LEN], other: Option<&[u8; KEY_LEN]>) -> Ring {
        let other = other.filter(|o| *o != active);
        Ring {
            active: keyed(active),
            other: other.map(keyed),
            prints: Fingerprints {
                active: fingerprint(active),
                other: other.map(fingerprint),
            },
        }
    }
}

struct Shared {
    /// The key file the ring is reloaded from (none: made from bytes).
    path: Option<PathBuf>,
    ring: RwLock<Ring>,
}

/// A cluster's keyring: the *active* key, which seals messages and
/// issues tickets, and at most one other key that is accepted too (the
/// next or previous key while the key is rotated). Clones share the ring,
/// so [`ClusterKey::reload`] on one is seen by every node holding a clone.
///
/// A seal or ticket is checked against the active key, then, only if that
/// fails, against the other one: at most two HMACs, each compared in
/// constant time.
#[derive(Clone)]
pub struct ClusterKey {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for ClusterKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ClusterKey(secret, {} accepted)", self.accepted())
    }
}

/// Refuses a key file whose mode lets other users read or write it.
fn refuse_shared(path: &Path) -> Result<(), Error> {
    use std::os::unix::fs::PermissionsExt;
    // A missing file is reported by the read, with its own advice.
    let Ok(meta) = std::fs::metadata(path) else {
        return Ok(());
    };
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(Error::key(format!(
            "the cluster key {} can be read or written by other users (mode {mode:04o}); \
             run `chmod 600 {}`",
            path.display(),
            path.display()
        )));
    }
    Ok(())
}

/// Reads one key file: exactly [`KEY_LEN`] bytes, mode 0600.
fn read_key(path: &Path) -> Result<[u8; KEY_LEN], Error> {
    refuse_shared(path)?;
    let bytes = std::fs::read(path).map_err(|e| {
        Error::io(
            format!(
                "reading the cluster key {} (the {KEY_FILE} that `strata store up` \
                 creates in its directory; give its path with --key)",
                path.display()
            ),
            e,
        )
    })?;
    bytes.as_slice().try_into().map_err(|_| {
        Error::key(format!(
            "{} holds {} bytes, but a cluster key is exactly {KEY_LEN} bytes: \
             copy the {KEY_FILE} of the cluster's `strata store up` directory",
            path.display(),
            bytes.len()
        ))
    })
}

fn keyed(bytes: &[u8; KEY_LEN]) -> Hmac<Sha256> {
    let Ok(mac) = Hmac::<Sha256>::new_from_slice(bytes) else {
        unreachable!("HMAC takes keys of any length");
    };
    mac
}

/// Reads the key in `path` and the keys in its `.next` and `.prev`
/// siblings that exist: at most two distinct keys in all.
fn read_ring(path: &Path) -> Result<Ring, Error> {
    let active = read_key(path)?;
    let mut other: Option<([u8; KEY_LEN], PathBuf)> = None;
    for suffix in [NEXT_SUFFIX, PREV_SUFFIX] {
        let file = sibling(path, suffix);
        if std::fs::symlink_metadata(&file).is_err() {
            continue;
        }
        let bytes = read_key(&file)?;
        if bytes == active {
            continue;
        }
        match &other {
            Some((b, _)) if *b == bytes => {}
            Some((_, first)) => {
                return Err(Error::key(format!(
                    "{} and {} hold two different keys besides the active key {}: \
                     a node accepts at most one other key; finish the rotation and \
                     remove the old key's file",
                    first.display(),
                    file.display(),
                    path.display()
                )))
            }
            None => other = Some((bytes, file)),
        }
    }
    Ok(Ring::new(&active, other.as_ref().map(|(b, _)| b)))
}

impl ClusterKey {
    /// A ring of one key, from its bytes ([`ClusterKey::reload`] keeps it).
    pub fn from_bytes(bytes: &[u8; KEY_LEN]) -> ClusterKey {
        ClusterKey::from_ring(bytes, None)
    }

    /// A ring that seals with `active` and accepts `active` and `other`.
    pub fn from_ring(active: &[u8; KEY_LEN], other: Option<&[u8; KEY_LEN]>) -> ClusterKey {
        ClusterKey::new(None, Ring::new(active, other))
    }

    fn new(path: Option<PathBuf>, ring: Ring) -> ClusterKey {
        ClusterKey {
            shared: Arc::new(Shared {
                path,
                ring: RwLock::new(ring),
            }),
        }
    }

    fn ring(&self) -> std::sync::RwLockReadGuard<'_, Ring> {
        // Nothing panics while holding the lock; a poisoned one is whole.
        self.shared.ring.read().unwrap_or_else(|e| e.into_inner())
    }

    /// Reads the keyring of the key file `path`: the active key in `path`
    /// itself, and the accepted key in `path.next` or `path.prev` if one
    /// exists (both may, holding the same key). Each file holds exactly
    /// [`KEY_LEN`] bytes, and no other user can read or write it (as ssh
    /// treats private keys: a key others can read is no longer a secret).
    pub fn load(path: &Path) -> Result<ClusterKey, Error> {
        let ring = read_ring(path)?;
        Ok(ClusterKey::new(Some(path.to_path_buf()), ring))
    }

    /// Writes a new random key to `path` (mode 0600), which must not
    /// exist yet.
    pub fn create(path: &Path) -> Result<(), Error> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let mut bytes = [0u8; KEY_LEN];
        getrandom::fill(&mut bytes).map_err(|e| Error::Key {
            context: format!("no randomness for a new cluster key {}", path.display()),
            // getrandom's error is no `std` error in this build: its OS
            // error, or its text, stands in as the source.
            source: Some(match e.raw_os_error() {
                Some(code) => Box::new(std::io::Error::from_raw_os_error(code)),
                None => e.to_string().into(),
            }),
        })?;
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .map_err(|e| Error::io(format!("creating the cluster key {}", path.display()), e))?;
        file.write_all(&bytes)
            .and_then(|()| file.sync_all())
            .map_err(|e| Error::io(format!("writing the cluster key {}", path.display()), e))
    }

    /// Reads the keyring of `path` ([`ClusterKey::load`]), or makes a new
    /// random key there (mode 0600) if there is no file and no `.next` or
    /// `.prev` one (those mean a rotation in progress lost its key file:
    /// refused rather than replaced by a key no other node holds).
    pub fn load_or_create(path: &Path) -> Result<ClusterKey, Error> {
        if std::fs::symlink_metadata(path).is_err() {
            for suffix in [NEXT_SUFFIX, PREV_SUFFIX] {
                let file = sibling(path, suffix);
                if std::fs::symlink_metadata(&file).is_ok() {
                    return Err(Error::key(format!(
                        "the cluster key {} is missing but {} exists: a key rotation \
                         was left half done; put the active key back in {}",
                        path.display(),
                        file.display(),
                        path.display()
                    )));
                }
            }
            match ClusterKey::create(path) {
                Ok(()) => {}
                // Made by another process meanwhile: load it.
                Err(Error::Io { source, .. })
                    if source.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(e),
            }
        }
        ClusterKey::load(path)
    }

    /// Re-reads the key files this ring was loaded from (see
    /// [`ClusterKey::load`]) and uses them from now on, in every clone;
    /// returns how many keys are accepted. On an error the ring is left
    /// as it was. A ring made from bytes is kept.
    pub fn reload(&self) -> Result<usize, Error> {
        if let Some(path) = &self.shared.path {
            let ring = read_ring(path)?;
            *self.shared.ring.write().unwrap_or_else(|e| e.into_inner()) = ring;
        }
        Ok(self.accepted())
    }

    /// The key file this ring was loaded from, if any.
    pub fn path(&self) -> Option<&Path> {
        self.shared.path.as_deref()
    }

    /// How many keys are accepted (1, or 2 during a rotation).
    pub fn accepted(&self) -> usize {
        1 + usize::from(self.ring().other.is_some())
    }

    /// The fingerprints of the active key and of the other accepted one,
    /// if any ([`fingerprint`]): what `strata store status` shows per node.
    pub fn fingerprints(&self) -> Fingerprints {
        self.ring().prints
    }

    /// The tag of `data` under the active key.
    pub fn tag(&self, data: &[u8]) -> [u8; TAG_LEN] {
        let mut mac = self.ring().active.clone();
        mac.update(data);
        let full = mac.finalize().into_bytes();
        let mut tag = [0u8; TAG_LEN];
        tag.copy_from_slice(&full[..TAG_LEN]);
        tag
    }

    /// Whether `tag` is the tag of `data` under an accepted key: the
    /// active one, else the other one (each compared in constant time).
    pub fn verify(&self, data: &[u8], tag: &[u8]) -> bool {
        if tag.len() != TAG_LEN {
            return false;
        }
        let ring = self.ring();
        let matches = |key: &Hmac<Sha256>| {
            let mut mac = key.clone();
            mac.update(data);
            mac.verify_truncated_left(tag).is_ok()
        };
        matches(&ring.active) || ring.other.as_ref().is_some_and(matches)
    }

    /// A secret derived from the active key: the full HMAC-SHA256 of
    /// `label` (which starts with a domain-separation prefix of its own,
    /// as [`crate::tenant`]'s do).
    pub fn derive(&self, label: &[u8]) -> [u8; KEY_LEN] {
        derive_with(&self.ring().active, label)
    }

    /// Whether `tag` is the tag of `data` under the secret derived from
    /// `label` by an accepted key: the active one, else the other one
    /// (each tag compared in constant time).
    pub fn verify_derived(&self, label: &[u8], data: &[u8], tag: &[u8]) -> bool {
        if tag.len() != TAG_LEN {
            return false;
        }
        let ring = self.ring();
        let matches = |key: &Hmac<Sha256>| {
            let mut mac = keyed(&derive_with(key, label));
            mac.update(data);
            mac.verify_truncated_left(tag).is_ok()
        };
        matches(&ring.active) || ring.other.as_ref().is_some_and(matches)
    }
}

/// Most derived secrets a [`DerivedKeys`] cache holds, over every key.
pub const DERIVED_CACHE: usize = 1024;

/// A bounded cache of secrets derived from the keys of a ring (tenants'
/// secrets), each already keyed into HMAC-SHA256, by the fingerprint of
/// the key that derived it and a name (the tenant id). Deriving a secret
/// costs an HMAC and keying another, about half of a tenant's seal check.
///
/// Only a secret whose tag just verified is kept, so a flood of requests
/// with made-up tenant ids (or forged tags) does not fill it; at
/// [`DERIVED_CACHE`] entries one is dropped, arbitrarily, for each new
/// one. Secrets of a key the ring no longer holds are dropped when the
/// cache is next used.
#[derive(Default)]
pub struct DerivedKeys {
    by_key: HashMap<u64, HashMap<String, Hmac<Sha256>>>,
    len: usize,
}

impl DerivedKeys {
    /// How many secrets are cached.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no secret is cached.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Drops the secrets of keys other than `prints`' (a reloaded ring).
    fn keep_only(&mut self, prints: &Fingerprints) {
        if self
            .by_key
            .keys()
            .all(|p| *p == prints.active || Some(*p) == prints.other)
        {
            return;
        }
        self.by_key
            .retain(|p, _| *p == prints.active || Some(*p) == prints.other);
        self.len = self.by_key.values().map(HashMap::len).sum();
    }

    /// Keeps only the secrets whose name `keep` accepts (the gate drops
    /// those of revoked credential generations).
    pub(crate) fn retain_names(&mut self, keep: impl Fn(&str) -> bool) {
        for names in self.by_key.values_mut() {
            names.retain(|name, _| keep(name));
        }
        self.by_key.retain(|_, names| !names.is_empty());
        self.len = self.by_key.values().map(HashMap::len).sum();
    }

    fn get(&self, print: u64, name: &str) -> Option<&Hmac<Sha256>> {
        self.by_key.get(&print)?.get(name)
    }

    fn insert(&mut self, print: u64, name: &str, mac: Hmac<Sha256>) {
        while self.len >= DERIVED_CACHE {
            let Some((&p, names)) = self.by_key.iter_mut().find(|(_, n)| !n.is_empty()) else {
                self.len = 0;
                break;
            };
            if let Some(victim) = names.keys().next().cloned() {
                names.remove(&victim);
                self.len -= 1;
            }
            if names.is_empty() {
                self.by_key.remove(&p);
            }
        }
        if self
            .by_key
            .entry(print)
            .or_default()
            .insert(name.to_string(), mac)
            .is_none()
        {
            self.len += 1;
        }
    }
}

impl ClusterKey {
    /// [`ClusterKey::verify_derived`] for the secret of `name`, whose
    /// label `label` makes, using and filling `cache`: a secret derived
    /// before by the same key is not derived again.
    pub fn verify_derived_cached(
        &self,
        cache: &mut DerivedKeys,
        name: &str,
        label: &dyn Fn() -> Vec<u8>,
        data: &[u8],
        tag: &[u8],
    ) -> bool {
        if tag.len() != TAG_LEN {
            return false;
        }
        let ring = self.ring();
        cache.keep_only(&ring.prints);
        // Secrets derived for this request, kept only if one of them
        // verifies: then the tenant is genuine, and during a rotation the
        // active key's secret (which did not match) is kept too, so a
        // credential of the other key is not derived again either.
        let mut derived: Vec<(u64, Hmac<Sha256>)> = Vec::new();
        let mut matches = |key: &Hmac<Sha256>, print: u64| {
            let check = |secret: &Hmac<Sha256>| {
                let mut mac = secret.clone();
                mac.update(data);
                mac.verify_truncated_left(tag).is_ok()
            };
            if let Some(secret) = cache.get(print, name) {
                return check(secret);
            }
            let secret = keyed(&derive_with(key, &label()));
            let ok = check(&secret);
            derived.push((print, secret));
            ok
        };
        let ok = matches(&ring.active, ring.prints.active)
            || ring
                .other
                .as_ref()
                .zip(ring.prints.other)
                .is_some_and(|(key, print)| matches(key, print));
        if ok {
            for (print, secret) in derived {
                cache.insert(print, name, secret);
            }
        }
        ok
    }
}

/// The full HMAC of `label` under `key`.
fn derive_with(key: &Hmac<Sha256>, label: &[u8]) -> [u8; KEY_LEN] {
    let mut mac = key.clone();
    mac.update(label);
    mac.finalize().into_bytes().into()
}

// A keyring's fingerprints on the wire (in the table and in
// registrations).
impl Writer {
    /// A keyring's fingerprints: the active one, a flag, and the other
    /// one if the flag is 1.
    pub fn prints(&mut self, v: &Fingerprints) {
        self.u64(v.active);
        match v.other {
            Some(o) => {
                self.u8(1);
                self.u64(o);
            }
            None => self.u8(0),
        }
    }
}

impl Reader<'_> {
    /// A keyring's fingerprints ([`crate::codec::Writer::prints`]).
    pub fn prints(&mut self) -> Result<Fingerprints, WireError> {
        let active = self.u64()?;
        let other = match self.u8()? {
            0 => None,
            1 => Some(self.u64()?),
            x => return Err(WireError::Invalid(format!("key fingerprint flag {x}"))),
        };
        Ok(Fingerprints { active, other })
    }

    /// An optional trailing [`Reader::prints`]: none if nothing is left.
    /// Zero padding after the body ([`crate::wire::Msg::encode_padded`]) is no
    /// fingerprint either (a fingerprint of zero has odds of 2^-64).
    pub fn opt_prints(&mut self) -> Result<Option<Fingerprints>, WireError> {
        if self.buf[self.pos..].iter().all(|&b| b == 0) {
            Ok(None)
        } else {
            self.prints().map(Some)
        }
    }
}

/// Milliseconds since the Unix epoch (0 if the clock is before it).
pub fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}
