//! Tenants' credentials, and the name scope each one grants.
//!
//! A tenant does not hold the cluster key. It holds a *credential*: its
//! tenant id, a generation, and a 32-byte secret derived from the cluster
//! key, `HMAC-SHA256(cluster key, "strata store tenant key v1\0" || id)`
//! for generation 0 (and `... || id || 0x00 || generation` above it), so
//! metadata nodes check a tenant's requests with no state besides the
//! key they already hold and the table's revocation list. It seals each
//! metadata request (Post, Link, Update, Get, Delete, List) with that
//! secret: the datagram carries the tenant id, the generation, the
//! client's clock and a truncated HMAC tag over every byte
//! before the tag ([`crate::wire::Msg::seal_tenant`]). A metadata node
//! derives the tenant's secret from each key of its keyring (the active
//! one, then the other one during a rotation), checks the tag in constant
//! time before decoding the body, refuses a clock more than
//! [`crate::auth::WINDOW_MS`] away, then refuses every name outside the
//! tenant's scope ([`crate::scope::check_scope`]).
//!
//! The scope rule: the tenant id [`ADMIN`] (`*`) may use every name; any
//! other tenant id `ID` (1 to [`MAX_TENANT_ID`] bytes of ASCII letters,
//! digits, `.`, `_` and `-`) may use only the names that begin with `ID/`
//! (the bucket `ID`), and list only prefixes that begin with `ID/`.
//!
//! Generations. The secret's derivation also covers a *generation*
//! number, which the credential file and every sealed request carry. The orchestrator keeps, per tenant, the lowest
//! generation still valid and publishes it in the table
//! ([`crate::table::Table::min_generation`]); a metadata node's gate
//! refuses a request whose generation is below it before checking its
//! tag. Revoking one tenant (`strata store tenant revoke`) raises its
//! minimum, and `strata store tenant add` issues the next generation: a
//! different secret, so no other tenant is touched. Rotating the cluster
//! key still revokes every tenant's credential at once.

use crate::error::Error;
use crate::key::{ClusterKey, DerivedKeys, KEY_LEN, TAG_LEN};
use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::path::{Path, PathBuf};

/// The tenant id whose scope is every name (the cluster's operator).
pub const ADMIN: &str = "*";

/// Longest tenant id, in bytes.
pub const MAX_TENANT_ID: usize = 64;

/// The credential file `strata store up` writes in its directory: the
/// [`ADMIN`] tenant's, so `strata obj --dir DIR` works with no setup.
pub const ADMIN_CREDENTIAL_FILE: &str = "admin.credential";

/// The environment variable naming a credential file (read by the
/// command-line tools and by [`TenantCredential::from_env`]).
pub const CREDENTIAL_ENV: &str = "STRATA_CREDENTIAL";

/// Domain-separation prefix of a tenant's secret: a tenant secret is
/// never a tag or ticket the cluster key makes for anything else.
const TENANT_DOMAIN: &[u8] = b"strata store tenant key v1\0";

/// Domain-separation prefix of a tenant id's hash ([`tenant_id_hash`]).
const TENANT_ID_HASH_DOMAIN: &[u8] = b"strata store tenant id v1\0";

/// A credential's generation: the orchestrator refuses generations below
/// a tenant's published minimum. Generation 0 is every tenant's first
/// (and every credential file written before generations existed).
pub type Generation = u32;

/// The 64-bit hash by which the table's revocation list names tenant
/// `id`: the first 8 bytes of SHA-256 over a domain prefix and the id.
/// Fixed-size entries keep the list inside one table datagram; two ids
/// sharing a hash (odds 2^-64 per pair) would share a minimum generation.
pub fn tenant_id_hash(id: &str) -> u64 {
    use sha2::Digest;
    let mut h = Sha256::new();
    h.update(TENANT_ID_HASH_DOMAIN);
    h.update(id.as_bytes());
    let digest = h.finalize();
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    u64::from_be_bytes(first)
}

/// Checks a tenant id: [`ADMIN`], or 1 to [`MAX_TENANT_ID`] bytes of ASCII
/// letters, digits, `.`, `_` and `-` (it is a bucket name, so no `/`).
pub fn check_tenant_id(id: &str) -> Result<(), String> {
    if id == ADMIN {
        return Ok(());
    }
    let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-');
    if id.is_empty() || id.len() > MAX_TENANT_ID || !id.chars().all(allowed) {
        return Err(format!(
            "tenant id {id:?} is not valid: use 1 to {MAX_TENANT_ID} ASCII letters, digits, \
             '.', '_' or '-' (the tenant then uses the names under 'ID/'), or '{ADMIN}' \
             for every name"
        ));
    }
    Ok(())
}

/// The prefix every name of tenant `id` begins with; `None` for
/// [`ADMIN`], whose scope is every name.
pub fn scope_prefix(id: &str) -> Option<String> {
    (id != ADMIN).then(|| format!("{id}/"))
}

/// How a tenant's scope is shown: `every name`, or `names under 'acme/'`.
pub fn describe_scope(id: &str) -> String {
    match scope_prefix(id) {
        None => "every name".into(),
        Some(p) => format!("names under '{p}'"),
    }
}

/// Whether tenant `id` may use the object name (or List prefix) `name`.
pub fn in_scope(id: &str, name: &str) -> bool {
    match scope_prefix(id) {
        None => true,
        Some(p) => name.starts_with(&p),
    }
}

/// A tenant's credential: its id and its secret, keyed into HMAC-SHA256
/// once. Made by [`TenantCredential::issue`] (with the cluster key) or
/// read from a file ([`TenantCredential::load`]).
#[derive(Clone)]
pub struct TenantCredential {
    tenant: String,
    generation: Generation,
    secret: [u8; KEY_LEN],
    mac: Hmac<Sha256>,
}

impl std::fmt::Debug for TenantCredential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "TenantCredential({:?}, generation {}, secret)",
            self.tenant, self.generation
        )
    }
}

/// First line of a credential file (a reminder of what it is).
const FILE_HEADER: &str = "# strata store tenant credential: a secret; keep it mode 0600";

impl TenantCredential {
    /// The generation-0 credential of tenant `tenant` with `secret`.
    pub fn new(tenant: &str, secret: [u8; KEY_LEN]) -> Result<TenantCredential, Error> {
        TenantCredential::with_generation(tenant, 0, secret)
    }

    /// The credential of tenant `tenant`, generation `generation`, with
    /// `secret`.
    pub fn with_generation(
        tenant: &str,
        generation: Generation,
        secret: [u8; KEY_LEN],
    ) -> Result<TenantCredential, Error> {
        check_tenant_id(tenant).map_err(Error::credential)?;
        let Ok(mac) = Hmac::<Sha256>::new_from_slice(&secret) else {
            unreachable!("HMAC takes keys of any length");
        };
        Ok(TenantCredential {
            tenant: tenant.to_string(),
            generation,
            secret,
            mac,
        })
    }

    /// Issues tenant `tenant`'s generation-0 credential under the active
    /// key of `key`.
    pub fn issue(key: &ClusterKey, tenant: &str) -> Result<TenantCredential, Error> {
        TenantCredential::issue_generation(key, tenant, 0)
    }

    /// Issues tenant `tenant`'s credential of generation `generation`
    /// under the active key of `key`.
    pub fn issue_generation(
        key: &ClusterKey,
        tenant: &str,
        generation: Generation,
    ) -> Result<TenantCredential, Error> {
        check_tenant_id(tenant).map_err(Error::credential)?;
        TenantCredential::with_generation(
            tenant,
            generation,
            key.derive(&tenant_label(tenant, generation)),
        )
    }

    /// The tenant id.
    pub fn tenant(&self) -> &str {
        &self.tenant
    }

    /// The credential's generation.
    pub fn generation(&self) -> Generation {
        self.generation
    }

    /// The tag of `data` under the tenant's secret.
    pub fn tag(&self, data: &[u8]) -> [u8; TAG_LEN] {
        let mut mac = self.mac.clone();
        mac.update(data);
        let full = mac.finalize().into_bytes();
        let mut tag = [0u8; TAG_LEN];
        tag.copy_from_slice(&full[..TAG_LEN]);
        tag
    }

    /// The secret's bytes.
    pub fn secret_bytes(&self) -> [u8; KEY_LEN] {
        self.secret
    }

    /// The secret as 64 lowercase hex digits (what the file holds).
    pub fn secret_hex(&self) -> String {
        self.secret.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// The file's text: a comment, `tenant ID`, `generation N` and
    /// `secret HEX`.
    pub fn to_file_text(&self) -> String {
        format!(
            "{FILE_HEADER}\ntenant {}\ngeneration {}\nsecret {}\n",
            self.tenant,
            self.generation,
            self.secret_hex()
        )
    }

    /// Parses a credential file's text; `source` names it in errors. A
    /// file with no `generation` line (written before generations
    /// existed) holds generation 0, which its secret was derived for.
    pub fn parse(text: &str, source: &str) -> Result<TenantCredential, Error> {
        let not_one = |why: &str| {
            format!(
                "{source} is not a tenant credential ({why}); make one with \
                 `strata store tenant add --dir DIR --tenant ID`"
            )
        };
        let bad = |why: &str| Error::credential(not_one(why));
        let (mut tenant, mut secret, mut generation) = (None, None, None);
        for line in text.lines().map(str::trim) {
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            match line.split_once(' ') {
                Some(("tenant", v)) => tenant = Some(v.trim()),
                Some(("secret", v)) => secret = Some(v.trim()),
                Some(("generation", v)) => {
                    let n = v
                        .trim()
                        .parse::<Generation>()
                        .map_err(|e| Error::Credential {
                            context: not_one(&format!(
                                "the generation {:?} is not a number from 0 to {}",
                                v.trim(),
                                Generation::MAX
                            )),
                            source: Some(Box::new(e)),
                        })?;
                    generation = Some(n);
                }
                _ => return Err(bad(&format!("unexpected line {line:?}"))),
            }
        }
        let tenant = tenant.ok_or_else(|| bad("no `tenant` line"))?;
        let hex = secret.ok_or_else(|| bad("no `secret` line"))?;
        let secret = parse_secret(hex).ok_or_else(|| bad("the secret is not 64 hex digits"))?;
        TenantCredential::with_generation(tenant, generation.unwrap_or(0), secret)
    }

    /// Reads a credential file, which no other user may read or write
    /// (like a cluster key).
    pub fn load(path: &Path) -> Result<TenantCredential, Error> {
        use std::os::unix::fs::PermissionsExt;
        let meta = std::fs::metadata(path).map_err(|e| {
            Error::io(
                format!(
                    "reading the tenant credential {} (`strata store up --dir DIR` writes \
                     DIR/{ADMIN_CREDENTIAL_FILE}; `strata store tenant add` makes others)",
                    path.display()
                ),
                e,
            )
        })?;
        let mode = meta.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            return Err(Error::credential(format!(
                "the tenant credential {} can be read or written by other users \
                 (mode {mode:04o}); run `chmod 600 {}`",
                path.display(),
                path.display()
            )));
        }
        let text = std::fs::read_to_string(path).map_err(|e| {
            Error::io(
                format!("reading the tenant credential {}", path.display()),
                e,
            )
        })?;
        TenantCredential::parse(&text, &path.display().to_string())
    }

    /// Writes the credential to `path` (mode 0600), replacing the file if
    /// it exists (a re-issue after a key rotation writes the same path).
    pub fn save(&self, path: &Path) -> Result<(), Error> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        // Written beside, then renamed: the file is whole at every moment
        // and never readable by others.
        let mut tmp = PathBuf::from(path.as_os_str());
        tmp.set_extension("credential.tmp");
        let _ = std::fs::remove_file(&tmp);
        let what = |e| {
            Error::io(
                format!("writing the tenant credential {}", path.display()),
                e,
            )
        };
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(what)?;
        file.write_all(self.to_file_text().as_bytes())
            .and_then(|()| file.sync_all())
            .map_err(what)?;
        std::fs::rename(&tmp, path).map_err(what)
    }

    /// The credential in the file named by [`CREDENTIAL_ENV`]; an error
    /// that says how to get one when the variable is not set.
    pub fn from_env() -> Result<TenantCredential, Error> {
        match std::env::var_os(CREDENTIAL_ENV) {
            Some(path) => TenantCredential::load(Path::new(&path)),
            None => Err(Error::credential(format!(
                "the object store needs a tenant credential: set {CREDENTIAL_ENV}=FILE \
                 (`strata store up --dir DIR` writes DIR/{ADMIN_CREDENTIAL_FILE}; \
                 `strata store tenant add` makes a tenant's)"
            ))),
        }
    }
}

fn parse_secret(hex: &str) -> Option<[u8; KEY_LEN]> {
    if hex.len() != 2 * KEY_LEN || !hex.is_ascii() {
        return None;
    }
    let mut out = [0u8; KEY_LEN];
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

/// What the cluster key's HMAC covers to derive the secret of tenant
/// `id`'s credential of generation `generation`: the domain and the id,
/// then for generations above 0 a zero byte and the generation (4 bytes,
/// big-endian). Generation 0 derives exactly what credentials made before
/// generations existed hold, so those keep working; the zero byte cannot
/// occur in an id, so no (id, generation) pair shares a label with another.
pub(crate) fn tenant_label(id: &str, generation: Generation) -> Vec<u8> {
    let mut label = Vec::with_capacity(TENANT_DOMAIN.len() + id.len() + 5);
    label.extend_from_slice(TENANT_DOMAIN);
    label.extend_from_slice(id.as_bytes());
    if generation > 0 {
        label.push(0);
        label.extend_from_slice(&generation.to_be_bytes());
    }
    label
}

/// The name a tenant's secret of one generation is cached under
/// (`ID/GENERATION`: an id holds no `/`).
pub(crate) fn cache_name(id: &str, generation: Generation) -> String {
    format!("{id}/{generation}")
}

/// The generation a [`cache_name`] names (`None` for another name).
pub(crate) fn cache_name_parts(name: &str) -> Option<(&str, Generation)> {
    let (id, generation) = name.rsplit_once('/')?;
    Some((id, generation.parse().ok()?))
}

/// Whether `tag` is the tag of `data` by tenant `id`'s credential of
/// generation `generation`, under a secret derived from an accepted key
/// of `key` (the active one, else the other one): two HMACs per key
/// tried, the tag compared in constant time. Whether the generation is
/// still valid is the gate's check, not this one.
pub fn verify(key: &ClusterKey, id: &str, generation: Generation, data: &[u8], tag: &[u8]) -> bool {
    if tag.len() != TAG_LEN || check_tenant_id(id).is_err() {
        return false;
    }
    key.verify_derived(&tenant_label(id, generation), data, tag)
}

/// [`verify`], with the tenant's secret derived once per key and
/// generation and kept in `cache` (a metadata node's gate holds one).
pub fn verify_cached(
    key: &ClusterKey,
    cache: &mut DerivedKeys,
    id: &str,
    generation: Generation,
    data: &[u8],
    tag: &[u8],
) -> bool {
    if tag.len() != TAG_LEN || check_tenant_id(id).is_err() {
        return false;
    }
    key.verify_derived_cached(
        cache,
        &cache_name(id, generation),
        &|| tenant_label(id, generation),
        data,
        tag,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(b: u8) -> ClusterKey {
        ClusterKey::from_bytes(&[b; KEY_LEN])
    }

    #[test]
    fn tenant_ids_follow_the_rule() {
        for good in ["acme", "a", "A-b_c.9", ADMIN, &"x".repeat(MAX_TENANT_ID)] {
            assert!(check_tenant_id(good).is_ok(), "{good}");
        }
        for bad in [
            "",
            "a/b",
            "a b",
            "é",
            "**",
            "a*",
            &"x".repeat(MAX_TENANT_ID + 1),
        ] {
            let err = check_tenant_id(bad).unwrap_err();
            assert!(err.contains("not valid"), "{bad}: {err}");
        }
    }

    #[test]
    fn secrets_are_derived_per_tenant_and_per_key() {
        let a = TenantCredential::issue(&key(1), "acme").unwrap();
        let again = TenantCredential::issue(&key(1), "acme").unwrap();
        assert_eq!(a.secret, again.secret);
        assert_ne!(a.secret, [1u8; KEY_LEN]);
        let other = TenantCredential::issue(&key(1), "acmf").unwrap();
        assert_ne!(a.secret, other.secret);
        let rotated = TenantCredential::issue(&key(2), "acme").unwrap();
        assert_ne!(a.secret, rotated.secret);
        let tag = a.tag(b"request");
        assert!(verify(&key(1), "acme", 0, b"request", &tag));
        // Another tenant's name, another key, another message, a cut tag.
        assert!(!verify(&key(1), "acmf", 0, b"request", &tag));
        assert!(!verify(&key(2), "acme", 0, b"request", &tag));
        assert!(!verify(&key(1), "acme", 0, b"requesT", &tag));
        assert!(!verify(&key(1), "acme", 0, b"request", &tag[..15]));
        assert!(!verify(&key(1), "a/b", 0, b"request", &tag));
        // Both keys of a ring are accepted; issued with the active one.
        let ring = ClusterKey::from_ring(&[2; KEY_LEN], Some(&[1; KEY_LEN]));
        assert!(verify(&ring, "acme", 0, b"request", &tag));
        assert!(verify(
            &ring,
            "acme",
            0,
            b"request",
            &rotated.tag(b"request")
        ));
        let issued = TenantCredential::issue(&ring, "acme").unwrap();
        assert_eq!(issued.secret, rotated.secret);
        // The admin's secret is not the key either.
        let admin = TenantCredential::issue(&key(1), ADMIN).unwrap();
        assert_ne!(admin.secret, a.secret);
        assert!(TenantCredential::issue(&key(1), "a/b").is_err());
    }

    #[test]
    fn each_generation_derives_its_own_secret_and_generation_0_is_the_old_one() {
        let k = key(1);
        let g0 = TenantCredential::issue(&k, "acme").unwrap();
        // Generation 0 is what credentials held before generations existed.
        let mut old_label = TENANT_DOMAIN.to_vec();
        old_label.extend_from_slice(b"acme");
        assert_eq!(g0.secret, k.derive(&old_label));
        assert_eq!(g0.generation(), 0);
        let g1 = TenantCredential::issue_generation(&k, "acme", 1).unwrap();
        let g2 = TenantCredential::issue_generation(&k, "acme", 2).unwrap();
        assert_eq!(g1.generation(), 1);
        assert_ne!(g1.secret, g0.secret);
        assert_ne!(g2.secret, g1.secret);
        let tag = g1.tag(b"request");
        assert!(verify(&k, "acme", 1, b"request", &tag));
        // The same secret does not pass as another generation's.
        assert!(!verify(&k, "acme", 0, b"request", &tag));
        assert!(!verify(&k, "acme", 2, b"request", &tag));
        // The file carries the generation; a file without one is generation 0.
        let back = TenantCredential::parse(&g2.to_file_text(), "F").unwrap();
        assert_eq!((back.generation(), back.secret), (2, g2.secret));
        let old_file = format!("tenant acme\nsecret {}\n", g0.secret_hex());
        let back = TenantCredential::parse(&old_file, "F").unwrap();
        assert_eq!((back.generation(), back.secret), (0, g0.secret));
        for bad in ["-1", "x", "4294967296", ""] {
            let text = format!(
                "tenant acme\ngeneration {bad}\nsecret {}\n",
                g0.secret_hex()
            );
            let err = TenantCredential::parse(&text, "F").unwrap_err().to_string();
            assert!(err.contains("generation"), "{bad}: {err}");
        }
        // Ids hash apart, and stably.
        assert_eq!(tenant_id_hash("acme"), tenant_id_hash("acme"));
        assert_ne!(tenant_id_hash("acme"), tenant_id_hash("acmf"));
        assert_eq!(cache_name_parts(&cache_name("acme", 7)), Some(("acme", 7)));
    }

    #[test]
    fn credential_files_round_trip_and_are_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("acme.credential");
        let cred = TenantCredential::issue(&key(1), "acme").unwrap();
        cred.save(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let back = TenantCredential::load(&path).unwrap();
        assert_eq!((back.tenant(), back.secret), ("acme", cred.secret));
        // Saved again over itself (a re-issue).
        cred.save(&path).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let err = TenantCredential::load(&path).unwrap_err().to_string();
        assert!(err.contains("chmod 600"), "{err}");
        let bad_id = format!("tenant a/b\nsecret {}\n", "0".repeat(64));
        for (text, want) in [
            ("tenant acme\n", "no `secret`"),
            ("secret 00\n", "no `tenant`"),
            ("tenant acme\nsecret 00\n", "64 hex"),
            (bad_id.as_str(), "not valid"),
            ("hello\n", "unexpected line"),
        ] {
            let err = TenantCredential::parse(text, "F").unwrap_err().to_string();
            assert!(err.contains(want), "{text:?}: {err}");
        }
    }
}
