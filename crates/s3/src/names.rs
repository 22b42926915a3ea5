//! Where S3 buckets and objects live in the store, and the S3 metadata
//! an object's record carries. No I/O.
//!
//! - A bucket `B` is the names under `B/`, and exists while its marker,
//!   the name `B/` itself, does (its bytes are the creation time, in
//!   milliseconds since the epoch, as decimal text).
//! - An object `K` of bucket `B` is the store object `B/K`: its bytes
//!   are the S3 body, and its record's attributes
//!   ([`strata_store_protocol::wire::Record::attributes`]) hold its S3
//!   metadata ([`ObjectMeta::attributes`]): the MD5 (the ETag), when the
//!   gateway stored it, the Content-Type and the `x-amz-meta-*` headers.
//!
//! So a Get or Head is one metadata lookup, a listing reads every key's
//! metadata from the List itself, the store's versions order overwrites,
//! and a name stored with `strata obj` is an S3 object too: its record
//! has no attributes, and [`ObjectMeta::from_record`] gives it the
//! CRC-32C as its ETag and the epoch as its time.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use strata_store_protocol::wire::{check_name, MAX_ATTRIBUTES};

/// The first byte of the attributes the gateway writes: the version of
/// their format, so a later gateway can change it and still read these.
/// Version 1 is this byte followed by a JSON document ([`Stored`]).
pub const ATTRIBUTES_VERSION: u8 = 1;

/// An object's S3 metadata.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectMeta {
    /// The S3 ETag: the MD5 of the body as 32 lowercase hex digits, or
    /// for a name stored without the gateway, its CRC-32C as 8.
    pub etag: String,
    /// The body's size in bytes (the store's record holds it).
    pub size: u64,
    /// When the gateway stored it, in milliseconds since the epoch (0 for
    /// a name stored without the gateway).
    pub modified_ms: u64,
    /// The Content-Type given at the Put.
    pub content_type: Option<String>,
    /// The user metadata (`x-amz-meta-*`), names without the prefix.
    pub metadata: BTreeMap<String, String>,
}

/// What the attributes hold, after their version byte: the metadata but
/// the size, which the record has already.
#[derive(Serialize, Deserialize)]
struct Stored {
    #[serde(rename = "e")]
    etag: String,
    #[serde(rename = "t")]
    modified_ms: u64,
    #[serde(rename = "c", default, skip_serializing_if = "Option::is_none")]
    content_type: Option<String>,
    #[serde(rename = "m", default, skip_serializing_if = "BTreeMap::is_empty")]
    metadata: BTreeMap<String, String>,
}

/// Why a key or its metadata cannot be stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NameError {
    /// The bucket and key do not make a store name.
    BadKey(String),
    /// The content type and user metadata do not fit a record.
    TooLarge {
        /// Their encoded length.
        length: usize,
    },
}

impl std::fmt::Display for NameError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NameError::BadKey(why) => write!(f, "{why}; choose another key"),
            NameError::TooLarge { length } => write!(
                f,
                "the content type and user metadata take {length} bytes once encoded; \
                 a store record holds {MAX_ATTRIBUTES}: shorten them"
            ),
        }
    }
}

/// The marker name of bucket `bucket`, which is also the prefix of its
/// objects' names.
pub fn bucket_prefix(bucket: &str) -> String {
    format!("{bucket}/")
}

/// The store name of the object `key` of `bucket`, if it is one: 1 to
/// 4,096 bytes with the bucket, no NUL.
pub fn object_name(bucket: &str, key: &str) -> Result<String, NameError> {
    if key.is_empty() {
        return Err(NameError::BadKey("the key is empty".into()));
    }
    let name = format!("{bucket}/{key}");
    check_name(&name).map_err(NameError::BadKey)?;
    Ok(name)
}

/// The key a store name of `bucket` names; `None` for the bucket's
/// marker and for names outside the bucket.
pub fn key_of<'a>(bucket: &str, name: &'a str) -> Option<&'a str> {
    let key = name.strip_prefix(bucket)?.strip_prefix('/')?;
    (!key.is_empty()).then_some(key)
}

impl ObjectMeta {
    /// The record attributes that hold this metadata (all but the size),
    /// if they fit a record.
    pub fn attributes(&self) -> Result<Vec<u8>, NameError> {
        let stored = Stored {
            etag: self.etag.clone(),
            modified_ms: self.modified_ms,
            content_type: self.content_type.clone(),
            metadata: self.metadata.clone(),
        };
        let mut bytes = vec![ATTRIBUTES_VERSION];
        // Strings and integers only: serializing cannot fail.
        bytes.extend(serde_json::to_vec(&stored).unwrap_or_default());
        if bytes.len() > MAX_ATTRIBUTES {
            return Err(NameError::TooLarge {
                length: bytes.len(),
            });
        }
        Ok(bytes)
    }

    /// The metadata of a store object of `size` bytes with CRC-32C `crc`
    /// and record `attributes`. Attributes the gateway did not write
    /// (none, for a name stored with `strata obj`, or of an unknown
    /// version) give the CRC-32C as the ETag, the epoch as the time, and
    /// no content type or user metadata.
    pub fn from_record(size: u64, crc: u32, attributes: &[u8]) -> ObjectMeta {
        let stored = match attributes.split_first() {
            Some((&ATTRIBUTES_VERSION, json)) => serde_json::from_slice::<Stored>(json).ok(),
            _ => None,
        };
        match stored {
            Some(stored) => ObjectMeta {
                etag: stored.etag,
                size,
                modified_ms: stored.modified_ms,
                content_type: stored.content_type,
                metadata: stored.metadata,
            },
            None => ObjectMeta {
                etag: format!("{crc:08x}"),
                size,
                modified_ms: 0,
                content_type: None,
                metadata: BTreeMap::new(),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta() -> ObjectMeta {
        ObjectMeta {
            etag: "d41d8cd98f00b204e9800998ecf8427e".into(),
            size: 12,
            modified_ms: 5,
            content_type: Some("text/plain".into()),
            metadata: BTreeMap::from([("colour".into(), "blue".into())]),
        }
    }

    #[test]
    fn metadata_gives_back_itself_through_its_attributes() {
        let bytes = meta().attributes().unwrap();
        assert_eq!(bytes[0], ATTRIBUTES_VERSION);
        assert_eq!(ObjectMeta::from_record(12, 0, &bytes), meta());
    }

    #[test]
    fn a_name_stored_without_the_gateway_has_its_crc_as_etag() {
        for attributes in [&b""[..], b"\x09{}", b"\x01not json"] {
            let plain = ObjectMeta::from_record(3, 0x00ab_cdef, attributes);
            assert_eq!(plain.etag, "00abcdef");
            assert_eq!((plain.size, plain.modified_ms), (3, 0));
            assert!(plain.content_type.is_none() && plain.metadata.is_empty());
        }
    }

    #[test]
    fn keys_map_to_names_and_back() {
        let name = object_name("acme", "dir/a b.txt").unwrap();
        assert_eq!(name, "acme/dir/a b.txt");
        assert_eq!(key_of("acme", &name), Some("dir/a b.txt"));
        assert_eq!(key_of("acme", "acme/"), None);
        assert_eq!(key_of("acme", "acmex/k"), None);
        // The byte the old name encoding reserved is an ordinary byte now.
        assert!(object_name("acme", "a\u{1}b").is_ok());
        assert!(object_name("acme", "a\0b").is_err());
        assert!(object_name("acme", "").is_err());
        assert!(object_name("acme", &"k".repeat(4096)).is_err());
    }

    #[test]
    fn oversized_metadata_is_refused() {
        let mut big = meta();
        big.metadata
            .insert("big".into(), "v".repeat(MAX_ATTRIBUTES));
        assert!(matches!(big.attributes(), Err(NameError::TooLarge { .. })));
    }
}
