//! Where S3 buckets and objects live in the store's name space. No I/O.
//!
//! The store keeps, per name, only bytes, a size, a CRC and a version:
//! no content type, no user metadata, no MD5 and no time. The gateway
//! keeps those in the object's *name*, so that one Post stores an object
//! and its metadata together (nothing by halves) and one List answers a
//! ListObjects with every key's size, ETag and time, reading no data:
//!
//! - a bucket `B` is the names under `B/`, and exists while its marker,
//!   the name `B/` itself, does (its bytes are the creation time, in
//!   milliseconds since the epoch, as decimal text);
//! - an object `K` of bucket `B` is the name `B/K` 0x01 `META`, where
//!   `META` is the unpadded base64url of a small JSON document
//!   ([`ObjectMeta`]); the store object's bytes are the S3 body, unchanged.
//!
//! So an S3 key may not hold the byte 0x01 (the store's names hold no
//! NUL either), and the key and its metadata together must fit the
//! store's 4,096-byte names. Because 0x01 sorts before every other byte a
//! key may hold, names sort in S3's key order. An overwrite writes a new
//! name and then deletes the older ones of the key; until then (or after
//! a gateway stopped between the two), readers take the newest
//! ([`newest`]), so a key never shows two bodies.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use strata_store_protocol::wire::MAX_NAME;

/// The byte between a key and its encoded metadata in a store name.
pub const SEPARATOR: char = '\u{1}';

/// What an object's store name carries besides its key.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObjectMeta {
    /// MD5 of the body, 32 lowercase hex digits: the S3 ETag.
    #[serde(rename = "e")]
    pub etag: String,
    /// The body's size in bytes.
    #[serde(rename = "s")]
    pub size: u64,
    /// When the gateway stored it, in milliseconds since the epoch.
    #[serde(rename = "t")]
    pub modified_ms: u64,
    /// The Content-Type given at the Put.
    #[serde(rename = "c", default, skip_serializing_if = "Option::is_none")]
    pub content_type: Option<String>,
    /// The user metadata (`x-amz-meta-*`), names without the prefix.
    #[serde(rename = "m", default, skip_serializing_if = "BTreeMap::is_empty")]
    pub metadata: BTreeMap<String, String>,
}

/// Why a key or its metadata cannot be stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NameError {
    /// The key holds a byte the store's names reserve.
    ReservedByte,
    /// The key and its metadata do not fit one store name.
    TooLong {
        /// The store name's length.
        length: usize,
    },
}

impl std::fmt::Display for NameError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NameError::ReservedByte => write!(
                f,
                "the key holds the byte 0x01 (or NUL), which the gateway reserves; \
                 choose a key without control bytes 0 and 1"
            ),
            NameError::TooLong { length } => write!(
                f,
                "the key, content type and user metadata take {length} bytes once encoded; \
                 the store's names hold {MAX_NAME}: shorten the metadata or the key"
            ),
        }
    }
}

/// The marker name of bucket `bucket`, which is also the prefix of its
/// objects' names.
pub fn bucket_prefix(bucket: &str) -> String {
    format!("{bucket}/")
}

/// The prefix every store name of key `key` in `bucket` starts with.
pub fn key_prefix(bucket: &str, key: &str) -> String {
    format!("{bucket}/{key}{SEPARATOR}")
}

/// A List cursor past every store name of key `key` (and of nothing
/// else): the encoded metadata is base64url, all below 0x7f.
pub fn after_key(bucket: &str, key: &str) -> String {
    format!("{bucket}/{key}{SEPARATOR}\u{7f}")
}

/// Checks that a key can be stored: no byte the names reserve.
pub fn check_key(key: &str) -> Result<(), NameError> {
    if key.contains(SEPARATOR) || key.contains('\0') {
        return Err(NameError::ReservedByte);
    }
    Ok(())
}

/// The store name of an object of `bucket` at `key` with `meta`.
pub fn object_name(bucket: &str, key: &str, meta: &ObjectMeta) -> Result<String, NameError> {
    check_key(key)?;
    let json = serde_json::to_vec(meta).unwrap_or_default();
    let name = format!(
        "{}{}",
        key_prefix(bucket, key),
        URL_SAFE_NO_PAD.encode(json)
    );
    if name.len() > MAX_NAME {
        return Err(NameError::TooLong { length: name.len() });
    }
    Ok(name)
}

/// The key and metadata a store name of `bucket` holds; `None` for a name
/// the gateway did not write (the bucket's marker, or a name stored with
/// `strata obj`).
pub fn parse_object_name<'a>(bucket: &str, name: &'a str) -> Option<(&'a str, ObjectMeta)> {
    let rest = name.strip_prefix(bucket)?.strip_prefix('/')?;
    let (key, encoded) = rest.split_once(SEPARATOR)?;
    let json = URL_SAFE_NO_PAD.decode(encoded).ok()?;
    let meta = serde_json::from_slice(&json).ok()?;
    Some((key, meta))
}

/// Of several store names of one key, the one readers take: the newest,
/// then the greatest name (so every gateway picks the same one).
pub fn newest<'a>(names: impl IntoIterator<Item = (&'a str, &'a ObjectMeta)>) -> Option<&'a str> {
    names
        .into_iter()
        .max_by(|a, b| a.1.modified_ms.cmp(&b.1.modified_ms).then(a.0.cmp(b.0)))
        .map(|(name, _)| name)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(modified_ms: u64) -> ObjectMeta {
        ObjectMeta {
            etag: "d41d8cd98f00b204e9800998ecf8427e".into(),
            size: 0,
            modified_ms,
            content_type: Some("text/plain".into()),
            metadata: BTreeMap::from([("colour".into(), "blue".into())]),
        }
    }

    #[test]
    fn an_object_name_gives_back_its_key_and_metadata() {
        let name = object_name("acme", "dir/a b.txt", &meta(5)).unwrap();
        assert!(name.starts_with("acme/dir/a b.txt\u{1}"));
        let (key, back) = parse_object_name("acme", &name).unwrap();
        assert_eq!(key, "dir/a b.txt");
        assert_eq!(back, meta(5));
        assert!(parse_object_name("acmex", &name).is_none());
        assert!(parse_object_name("acme", "acme/").is_none());
        assert!(parse_object_name("acme", "acme/plain-store-name").is_none());
    }

    #[test]
    fn names_sort_in_key_order() {
        let keys = ["a", "a/b", "a0", "ab", "b"];
        let names: Vec<String> = keys
            .iter()
            .map(|k| object_name("x", k, &meta(1)).unwrap())
            .collect();
        let mut sorted = names.clone();
        sorted.sort();
        assert_eq!(names, sorted);
        for (key, name) in keys.iter().zip(&names) {
            assert!(after_key("x", key).as_str() > name.as_str());
        }
        assert!(after_key("x", "a").as_str() < names[1].as_str());
    }

    #[test]
    fn reserved_bytes_and_oversized_names_are_refused() {
        assert_eq!(check_key("a\u{1}b"), Err(NameError::ReservedByte));
        assert_eq!(check_key("a\0b"), Err(NameError::ReservedByte));
        let mut big = meta(1);
        big.metadata.insert("big".into(), "v".repeat(4000));
        assert!(matches!(
            object_name("x", "k", &big),
            Err(NameError::TooLong { .. })
        ));
    }

    #[test]
    fn the_newest_name_wins() {
        let (old, new) = (meta(1), meta(2));
        let picked = newest([("n-old", &old), ("n-new", &new)]);
        assert_eq!(picked, Some("n-new"));
        let tie = newest([("b", &old), ("a", &old)]);
        assert_eq!(tie, Some("b"));
    }
}
