//! ListObjectsV2 and ListObjects: the store's names under the bucket and
//! prefix, read in pages (each entry with its record's attributes, so
//! with its S3 metadata) and grouped by delimiter.

use crate::errors::{from_store, s3};
use crate::names::{bucket_prefix, key_of, reserved_prefix, ObjectMeta};
use crate::Gateway;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use s3s::{S3ErrorCode, S3Result};
use strata_store_client::client::Client;

/// Most keys one page of a listing returns (S3's own bound).
pub const MAX_KEYS: usize = 1000;

/// Names the gateway asks the store for at once.
const STORE_PAGE: u32 = 1000;

/// Where a listing resumes: after a key, or after every key under a
/// common prefix.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Position {
    /// After this key.
    Key(String),
    /// After every key starting with this common prefix.
    Prefix(String),
}

impl Position {
    /// The continuation token of this position.
    pub fn token(&self) -> String {
        let text = match self {
            Position::Key(key) => format!("k{key}"),
            Position::Prefix(prefix) => format!("p{prefix}"),
        };
        URL_SAFE_NO_PAD.encode(text)
    }

    /// The position a continuation token names.
    pub fn from_token(token: &str) -> S3Result<Position> {
        let bad = || {
            s3(
                S3ErrorCode::InvalidArgument,
                format!("the continuation token {token:?} is not one this gateway gave"),
            )
        };
        let bytes = URL_SAFE_NO_PAD.decode(token).map_err(|_| bad())?;
        let text = String::from_utf8(bytes).map_err(|_| bad())?;
        match text.split_at_checked(1) {
            Some(("k", key)) => Ok(Position::Key(key.to_string())),
            Some(("p", prefix)) => Ok(Position::Prefix(prefix.to_string())),
            _ => Err(bad()),
        }
    }

    /// The key or prefix itself (ListObjects' NextMarker).
    pub fn text(&self) -> &str {
        match self {
            Position::Key(text) | Position::Prefix(text) => text,
        }
    }

    /// Whether `key` comes at or before this position.
    fn covers(&self, key: &str) -> bool {
        match self {
            Position::Key(after) => key <= after.as_str(),
            Position::Prefix(prefix) => key <= prefix.as_str() || key.starts_with(prefix.as_str()),
        }
    }
}

/// What a listing asks.
pub(crate) struct ListRequest {
    /// The bucket.
    pub bucket: String,
    /// Only keys starting with this.
    pub prefix: String,
    /// Keys holding this after the prefix are rolled up into common
    /// prefixes.
    pub delimiter: Option<String>,
    /// Where to resume.
    pub after: Option<Position>,
    /// At most this many keys and prefixes (at most [`MAX_KEYS`]).
    pub max_keys: usize,
}

/// One page of a listing.
#[derive(Default)]
pub(crate) struct Page {
    /// Keys and their metadata, in key order.
    pub objects: Vec<(String, ObjectMeta)>,
    /// Common prefixes, in order.
    pub prefixes: Vec<String>,
    /// Whether more keys follow.
    pub truncated: bool,
    /// The last key or prefix returned (where the next page starts).
    pub last: Option<Position>,
    max: usize,
}

impl Page {
    /// Adds an item; false (and the page marked truncated) once full.
    fn push(&mut self, item: Position, meta: Option<ObjectMeta>) -> bool {
        if self.objects.len() + self.prefixes.len() >= self.max {
            self.truncated = true;
            return false;
        }
        match (&item, meta) {
            (Position::Key(key), Some(meta)) => self.objects.push((key.clone(), meta)),
            (Position::Prefix(prefix), _) => self.prefixes.push(prefix.clone()),
            (Position::Key(_), None) => return true,
        }
        self.last = Some(item);
        true
    }
}

impl Gateway {
    /// One page of a listing.
    pub(crate) async fn list_objects(
        &self,
        client: &Client,
        request: ListRequest,
    ) -> S3Result<Page> {
        self.bucket_exists(client, &request.bucket).await?;
        let bucket = request.bucket.as_str();
        let store_prefix = format!("{}{}", bucket_prefix(bucket), request.prefix);
        let mut page = Page {
            max: request.max_keys.min(MAX_KEYS),
            ..Page::default()
        };
        let mut after = match &request.after {
            None => String::new(),
            Some(Position::Key(key)) => format!("{bucket}/{key}"),
            Some(Position::Prefix(prefix)) => format!("{bucket}/{prefix}\u{10FFFF}"),
        };
        let mut skip = request.after.clone();
        let reserved = reserved_prefix(bucket);
        loop {
            let (entries, cursor) = client
                .list(&store_prefix, &after, STORE_PAGE)
                .await
                .map_err(|e| from_store(&format!("listing bucket '{bucket}'"), &e))?;
            for entry in entries {
                let Some(key) = key_of(bucket, &entry.name) else {
                    if entry.name.starts_with(&reserved) {
                        // Past every multipart name at once: no key is
                        // among them.
                        after = after.max(format!("{reserved}\u{10FFFF}"));
                    }
                    continue;
                };
                if skip.as_ref().is_some_and(|position| position.covers(key)) {
                    continue;
                }
                let rolled = request.delimiter.as_deref().and_then(|delimiter| {
                    let rest = key.get(request.prefix.len()..)?;
                    let at = rest.find(delimiter).filter(|_| !delimiter.is_empty())?;
                    Some(key[..request.prefix.len() + at + delimiter.len()].to_string())
                });
                match rolled {
                    Some(prefix) => {
                        if !page.push(Position::Prefix(prefix.clone()), None) {
                            return Ok(page);
                        }
                        after = after.max(format!("{bucket}/{prefix}\u{10FFFF}"));
                        skip = Some(Position::Prefix(prefix));
                    }
                    None => {
                        let meta =
                            ObjectMeta::from_record(entry.size, entry.crc, &entry.attributes);
                        if !page.push(Position::Key(key.to_string()), Some(meta)) {
                            return Ok(page);
                        }
                    }
                }
            }
            match cursor {
                Some(cursor) => after = after.max(cursor),
                None => break,
            }
        }
        Ok(page)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_gives_back_its_position() {
        for position in [
            Position::Key("a/b c".into()),
            Position::Prefix("dir/".into()),
            Position::Key(String::new()),
        ] {
            assert_eq!(Position::from_token(&position.token()).unwrap(), position);
        }
        assert!(Position::from_token("!!").is_err());
        assert!(Position::from_token(&URL_SAFE_NO_PAD.encode("xkey")).is_err());
    }

    #[test]
    fn a_prefix_position_covers_its_keys() {
        let at = Position::Prefix("dir/".into());
        assert!(at.covers("dir/a"));
        assert!(at.covers("a"));
        assert!(!at.covers("dir0"));
        assert!(Position::Key("b".into()).covers("b"));
        assert!(!Position::Key("b".into()).covers("ba"));
    }
}
