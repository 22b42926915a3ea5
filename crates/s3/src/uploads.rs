//! ListMultipartUploads: the pending uploads' store names
//! (`B/.strata-multipart/u/HEX(K)/U`, [`crate::names`]) read in key
//! order, and with a delimiter rolled up into common prefixes as S3 does.

use crate::errors::from_store;
use crate::names::{parse_upload_name, upload_name, uploads_prefix, ObjectMeta};
use crate::parts::STORE_PAGE;
use crate::Gateway;
use s3s::S3Result;
use strata_store_client::client::Client;

/// What a ListMultipartUploads asks.
pub(crate) struct UploadsQuery<'a> {
    /// Only keys starting with this.
    pub prefix: &'a str,
    /// Keys holding this after the prefix are rolled up into one common
    /// prefix each (up to and with the delimiter's first occurrence).
    pub delimiter: Option<&'a str>,
    /// Only keys after this one (or this one's uploads after
    /// `upload_marker`); a common prefix at or before it was listed
    /// already.
    pub key_marker: Option<&'a str>,
    /// With `key_marker`: that key's uploads after this id.
    pub upload_marker: Option<&'a str>,
    /// At most this many uploads and common prefixes.
    pub max: usize,
}

/// An entry of a ListMultipartUploads page.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Listed {
    /// A pending upload: its key, its id and its start (ms since the
    /// epoch).
    Upload(String, String, u64),
    /// A common prefix.
    Prefix(String),
}

/// One page of ListMultipartUploads.
pub(crate) struct UploadsPage {
    /// Uploads and common prefixes, in key order.
    pub entries: Vec<Listed>,
    /// Whether more follow.
    pub truncated: bool,
}

impl UploadsPage {
    /// The pending uploads listed: key, upload id, start.
    pub fn uploads(&self) -> impl Iterator<Item = (&str, &str, u64)> {
        self.entries.iter().filter_map(|entry| match entry {
            Listed::Upload(key, upload, started) => Some((key.as_str(), upload.as_str(), *started)),
            Listed::Prefix(_) => None,
        })
    }

    /// The common prefixes listed.
    pub fn prefixes(&self) -> impl Iterator<Item = &str> {
        self.entries.iter().filter_map(|entry| match entry {
            Listed::Prefix(prefix) => Some(prefix.as_str()),
            Listed::Upload(..) => None,
        })
    }

    /// Where the next page starts, if the page is truncated: the key
    /// marker (a key, or the last common prefix) and the upload-id
    /// marker (none after a common prefix).
    pub fn next_markers(&self) -> Option<(String, Option<String>)> {
        match self.entries.last().filter(|_| self.truncated)? {
            Listed::Upload(key, upload, _) => Some((key.clone(), Some(upload.clone()))),
            Listed::Prefix(prefix) => Some((prefix.clone(), None)),
        }
    }
}

/// The common prefix `key` rolls up into under `prefix` and `delimiter`,
/// if it holds the delimiter after the prefix.
fn rolled_up(key: &str, prefix: &str, delimiter: Option<&str>) -> Option<String> {
    let delimiter = delimiter.filter(|d| !d.is_empty())?;
    let rest = key.get(prefix.len()..)?;
    let at = rest.find(delimiter)?;
    Some(key[..prefix.len() + at + delimiter.len()].to_string())
}

impl Gateway {
    /// ListMultipartUploads: up to `query.max` pending uploads and common
    /// prefixes of keys starting with the prefix, in key then upload-id
    /// order, after the markers.
    pub(crate) async fn list_uploads(
        &self,
        client: &Client,
        bucket: &str,
        query: &UploadsQuery<'_>,
    ) -> S3Result<UploadsPage> {
        self.bucket_exists(client, bucket).await?;
        let store_prefix = uploads_prefix(bucket, query.prefix);
        let mut cursor = match (query.key_marker, query.upload_marker) {
            (Some(key), Some(upload)) => upload_name(bucket, key, upload),
            // After every upload of the key: its names end '/' and an id.
            (Some(key), None) => format!("{}/\u{10FFFF}", uploads_prefix(bucket, key)),
            (None, _) => String::new(),
        };
        let mut page = UploadsPage {
            entries: Vec::new(),
            truncated: false,
        };
        loop {
            let (names, next) = client
                .list(&store_prefix, &cursor, STORE_PAGE)
                .await
                .map_err(|e| from_store(&format!("listing the uploads of '{bucket}'"), &e))?;
            for entry in names {
                if entry.name <= cursor {
                    // Under a common prefix passed over below.
                    continue;
                }
                let Some((key, upload)) = parse_upload_name(bucket, &entry.name) else {
                    continue;
                };
                let listed = match rolled_up(&key, query.prefix, query.delimiter) {
                    Some(prefix) => {
                        // Past every upload of a key under the prefix
                        // (their hex names all start with its hex).
                        cursor =
                            cursor.max(format!("{}\u{10FFFF}", uploads_prefix(bucket, &prefix)));
                        if query
                            .key_marker
                            .is_some_and(|marker| prefix.as_str() <= marker)
                        {
                            continue;
                        }
                        Listed::Prefix(prefix)
                    }
                    None => {
                        let meta = ObjectMeta::from_record(0, entry.crc, &entry.attributes);
                        Listed::Upload(key, upload, meta.modified_ms)
                    }
                };
                if page.entries.len() >= query.max {
                    page.truncated = true;
                    return Ok(page);
                }
                page.entries.push(listed);
            }
            match next {
                Some(next) => cursor = cursor.max(next),
                None => return Ok(page),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_roll_up_at_the_first_delimiter_after_the_prefix() {
        assert_eq!(rolled_up("a/b/c", "", Some("/")), Some("a/".into()));
        assert_eq!(rolled_up("a/b/c", "a/", Some("/")), Some("a/b/".into()));
        assert_eq!(rolled_up("a/b", "a/", Some("/")), None);
        assert_eq!(rolled_up("a/b", "", None), None);
        assert_eq!(rolled_up("a/b", "", Some("")), None);
        assert_eq!(rolled_up("x--y--z", "x", Some("--")), Some("x--".into()));
    }
}
