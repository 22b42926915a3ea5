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
//! - A multipart upload's state and parts live under the bucket's
//!   reserved prefix [`RESERVED`] (`B/.strata-multipart/`), which no key
//!   may start with and listings never show: the upload `U` of key `K`
//!   is the empty object [`upload_name`] (its attributes hold the
//!   content type, user metadata, checksum algorithm and start time),
//!   and each UploadPart of its part `N` stores the object
//!   [`part_name`], unique to that attempt (its attributes hold the
//!   part's MD5 and checksum). The key
//!   is written in hex there, so names sort as keys do and no byte of a
//!   key can be mistaken for a separator. A completed upload is a
//!   *manifest* at `B/K`: its attributes say so ([`Multipart`]) and its
//!   body lists the parts ([`crate::multipart`]).
//!
//! So a Get or Head is one metadata lookup, a listing reads every key's
//! metadata from the List itself, the store's versions order overwrites,
//! and a name stored with `strata obj` is an S3 object too: its record
//! has no attributes, and [`ObjectMeta::from_record`] gives it the
//! CRC-32C as its ETag and the epoch as its time.

use crate::checksums::KeptChecksum;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use strata_store_protocol::wire::{check_name, MAX_ATTRIBUTES};

/// The first byte of the attributes the gateway writes: the version of
/// their format, so a later gateway can change it and still read these.
/// Version 1 is this byte followed by a JSON document ([`Stored`]).
pub const ATTRIBUTES_VERSION: u8 = 1;

/// Keys starting with this are refused, and names under `B/` starting
/// with it are the gateway's own: multipart uploads and their parts.
pub const RESERVED: &str = ".strata-multipart/";

/// What marks an object as a completed multipart upload's manifest.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Multipart {
    /// The upload's id: its parts are [`part_name`]s with it.
    #[serde(rename = "u")]
    pub upload: String,
    /// How many parts the object has.
    #[serde(rename = "n")]
    pub parts: u32,
    /// The object's size: the sum of its parts' (the record's size is the
    /// manifest's).
    #[serde(rename = "s")]
    pub size: u64,
}

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
    /// For a completed multipart upload, its manifest's mark.
    pub multipart: Option<Multipart>,
    /// The checksum kept with it ([`crate::checksums`]), if one was
    /// given or asked for when it was stored.
    pub checksum: Option<KeptChecksum>,
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
    #[serde(rename = "x", default, skip_serializing_if = "Option::is_none")]
    multipart: Option<Multipart>,
    #[serde(rename = "k", default, skip_serializing_if = "Option::is_none")]
    checksum: Option<KeptChecksum>,
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
/// 4,096 bytes with the bucket, no NUL, not under [`RESERVED`].
pub fn object_name(bucket: &str, key: &str) -> Result<String, NameError> {
    if key.is_empty() {
        return Err(NameError::BadKey("the key is empty".into()));
    }
    if key.starts_with(RESERVED) {
        return Err(NameError::BadKey(format!(
            "keys starting with '{RESERVED}' are the gateway's own (multipart uploads)"
        )));
    }
    let name = format!("{bucket}/{key}");
    check_name(&name).map_err(NameError::BadKey)?;
    Ok(name)
}

/// The key a store name of `bucket` names; `None` for the bucket's
/// marker, the gateway's own names ([`RESERVED`]) and names outside the
/// bucket.
pub fn key_of<'a>(bucket: &str, name: &'a str) -> Option<&'a str> {
    let key = name.strip_prefix(bucket)?.strip_prefix('/')?;
    (!key.is_empty() && !key.starts_with(RESERVED)).then_some(key)
}

/// The prefix of every name of `bucket` the gateway keeps for itself.
pub fn reserved_prefix(bucket: &str) -> String {
    format!("{bucket}/{RESERVED}")
}

/// The prefix of the pending uploads of keys starting with `key_prefix`.
pub fn uploads_prefix(bucket: &str, key_prefix: &str) -> String {
    format!("{bucket}/{RESERVED}u/{}", hex(key_prefix.as_bytes()))
}

/// The store name of upload `upload` of `key` while it is pending.
pub fn upload_name(bucket: &str, key: &str, upload: &str) -> String {
    format!("{}/{upload}", uploads_prefix(bucket, key))
}

/// The prefix of the parts of every upload.
pub fn all_parts_prefix(bucket: &str) -> String {
    format!("{bucket}/{RESERVED}p/")
}

/// The prefix of the parts of upload `upload` of `key`.
pub fn parts_prefix(bucket: &str, key: &str, upload: &str) -> String {
    format!(
        "{}{}/{upload}/",
        all_parts_prefix(bucket),
        hex(key.as_bytes())
    )
}

/// The store name of one attempt at part `number` of upload `upload`
/// of `key`: five digits, so names sort as part numbers do, then `-`
/// and the attempt's id, so that every UploadPart stores under a name of
/// its own and a Complete's manifest names exactly the bytes it checked.
/// Attempt ids sort in the order their UploadParts started (a clock,
/// then random bits). A name without an attempt (`None`) is one an older
/// gateway stored.
pub fn part_name(
    bucket: &str,
    key: &str,
    upload: &str,
    number: u32,
    attempt: Option<&str>,
) -> String {
    let prefix = parts_prefix(bucket, key, upload);
    match attempt {
        Some(attempt) => format!("{prefix}{number:05}-{attempt}"),
        None => format!("{prefix}{number:05}"),
    }
}

/// The longest attempt id a part name may hold.
pub const MAX_ATTEMPT: usize = 32;

/// What a part's store name holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PartName {
    /// The key being uploaded.
    pub key: String,
    /// The upload id.
    pub upload: String,
    /// The part number.
    pub number: u32,
    /// The attempt id (`None` for a name an older gateway stored).
    pub attempt: Option<String>,
}

/// The key and upload id a pending upload's store name holds.
pub fn parse_upload_name(bucket: &str, name: &str) -> Option<(String, String)> {
    let rest = name.strip_prefix(&uploads_prefix(bucket, ""))?;
    let (key, upload) = rest.split_once('/')?;
    Some((unhex(key)?, upload.to_string()))
}

/// The key, upload id, part number and attempt a part's store name
/// holds; `None` for a name this gateway does not write.
pub fn parse_part_name(bucket: &str, name: &str) -> Option<PartName> {
    let rest = name.strip_prefix(&all_parts_prefix(bucket))?;
    let mut fields = rest.split('/');
    let (key, upload, part) = (fields.next()?, fields.next()?, fields.next()?);
    if fields.next().is_some() {
        return None;
    }
    let (number, attempt) = match part.split_once('-') {
        Some((number, attempt)) => (number, Some(attempt)),
        None => (part, None),
    };
    let good_attempt = |attempt: &str| {
        !attempt.is_empty()
            && attempt.len() <= MAX_ATTEMPT
            && attempt.bytes().all(|b| b.is_ascii_hexdigit())
    };
    if number.len() != 5 || attempt.is_some_and(|attempt| !good_attempt(attempt)) {
        return None;
    }
    Some(PartName {
        key: unhex(key)?,
        upload: upload.to_string(),
        number: number.parse().ok()?,
        attempt: attempt.map(str::to_string),
    })
}

/// Lowercase hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The text whose UTF-8 bytes `text` is the lowercase hex of.
fn unhex(text: &str) -> Option<String> {
    let bytes = text
        .as_bytes()
        .chunks(2)
        .map(|pair| u8::from_str_radix(std::str::from_utf8(pair).ok()?, 16).ok())
        .collect::<Option<Vec<u8>>>()?;
    if bytes.len() * 2 != text.len() {
        return None;
    }
    String::from_utf8(bytes).ok()
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
            multipart: self.multipart.clone(),
            checksum: self.checksum.clone(),
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
    /// and record `attributes` (a manifest's size is its parts'). Attributes the gateway did not write
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
                size: stored.multipart.as_ref().map_or(size, |m| m.size),
                modified_ms: stored.modified_ms,
                content_type: stored.content_type,
                metadata: stored.metadata,
                multipart: stored.multipart,
                checksum: stored.checksum,
            },
            None => ObjectMeta {
                etag: format!("{crc:08x}"),
                size,
                modified_ms: 0,
                content_type: None,
                metadata: BTreeMap::new(),
                multipart: None,
                checksum: None,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checksums::Algorithm;

    fn meta() -> ObjectMeta {
        ObjectMeta {
            etag: "d41d8cd98f00b204e9800998ecf8427e".into(),
            size: 12,
            modified_ms: 5,
            content_type: Some("text/plain".into()),
            metadata: BTreeMap::from([("colour".into(), "blue".into())]),
            multipart: None,
            checksum: Some(KeptChecksum {
                algorithm: Algorithm::Crc32c,
                value: "yZRlqg==".into(),
                full_object: false,
            }),
        }
    }

    #[test]
    fn a_manifest_has_its_parts_size() {
        let mut manifest = meta();
        manifest.multipart = Some(Multipart {
            upload: "ab12".into(),
            parts: 3,
            size: 15 << 20,
        });
        let bytes = manifest.attributes().unwrap();
        let back = ObjectMeta::from_record(200, 0, &bytes);
        assert_eq!(back.size, 15 << 20);
        assert_eq!(back.multipart, manifest.multipart);
    }

    #[test]
    fn upload_and_part_names_give_back_their_key() {
        let key = "dir/a b\u{1}/z";
        let upload = upload_name("acme", key, "00ff");
        assert!(upload.starts_with("acme/.strata-multipart/u/"));
        assert_eq!(
            parse_upload_name("acme", &upload),
            Some((key.to_string(), "00ff".to_string()))
        );
        let part = part_name("acme", key, "00ff", 42, Some("0abc"));
        assert!(part.ends_with("/00ff/00042-0abc"), "{part}");
        let parsed = PartName {
            key: key.to_string(),
            upload: "00ff".to_string(),
            number: 42,
            attempt: Some("0abc".to_string()),
        };
        assert_eq!(parse_part_name("acme", &part), Some(parsed.clone()));
        // An older gateway's name, without an attempt, sorts before every
        // attempt of its number and after the numbers before it.
        let old = part_name("acme", key, "00ff", 42, None);
        assert!(old.ends_with("/00ff/00042") && old < part);
        assert!(part_name("acme", key, "00ff", 41, Some("ffff")) < old);
        let old_parsed = PartName {
            attempt: None,
            ..parsed
        };
        assert_eq!(parse_part_name("acme", &old), Some(old_parsed));
        for bad in ["00042-", "00042-xyz", "42-0abc", "00042-0abc-1"] {
            let name = format!("{}{bad}", parts_prefix("acme", key, "00ff"));
            assert_eq!(parse_part_name("acme", &name), None, "{bad}");
        }
        // Keys sort as their hex does: a key before its extensions.
        assert!(upload_name("acme", "a", "f") < upload_name("acme", "a/", "0"));
        assert!(upload_name("acme", "a", "f") < upload_name("acme", "b", "0"));
        assert_eq!(
            parse_upload_name("acme", "acme/.strata-multipart/u/6/x"),
            None
        );
    }

    #[test]
    fn reserved_names_are_no_keys() {
        assert!(object_name("acme", ".strata-multipart/p/x").is_err());
        assert!(object_name("acme", ".strata-multipart").is_ok());
        assert_eq!(key_of("acme", "acme/.strata-multipart/u/61/f"), None);
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
