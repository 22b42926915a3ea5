//! Reading an object, plain or a multipart manifest over its parts, and
//! the parts' life: the upload a name's manifest holds, and dropping
//! parts nothing uses. Shared by the object, copy and multipart calls.

use crate::errors::{is_missing, s3};
use crate::names::{
    object_name, parse_part_name, part_name, parts_prefix, upload_name, NameError, ObjectMeta,
};
use crate::streams::{Piece, Sink, PIECES_IN_FLIGHT};
use s3s::{S3ErrorCode, S3Result};
use serde::{Deserialize, Serialize};
use std::collections::HashSet;
use std::ops::Range;
use std::sync::Arc;
use strata_store_client::client::{Client, Opened};
use strata_store_protocol::Error;
use tokio::sync::mpsc;

/// The largest manifest read: 10,000 parts take well under this.
pub(crate) const MAX_MANIFEST: u64 = 4 << 20;
/// Names asked of the store at once.
pub(crate) const STORE_PAGE: u32 = 1000;

/// The body of a manifest: the parts, in order.
#[derive(Serialize, Deserialize)]
pub(crate) struct Manifest {
    #[serde(rename = "p")]
    pub(crate) parts: Vec<PartRef>,
}

/// One part as a manifest names it.
#[derive(Clone, Serialize, Deserialize)]
pub(crate) struct PartRef {
    /// Its part number.
    #[serde(rename = "n")]
    pub(crate) number: u32,
    /// Its size in bytes.
    #[serde(rename = "s")]
    pub(crate) size: u64,
    /// Its store version: a part overwritten since is not served.
    #[serde(rename = "v")]
    pub(crate) version: u64,
    /// Its MD5, as hex.
    #[serde(rename = "e")]
    pub(crate) etag: String,
    /// The id of the UploadPart that stored it (`None` in the manifests
    /// of older gateways, whose parts had no attempt ids).
    #[serde(rename = "a", default, skip_serializing_if = "Option::is_none")]
    pub(crate) attempt: Option<String>,
    /// Its checksum of the upload's algorithm (base64), if it had one.
    #[serde(rename = "c", default, skip_serializing_if = "Option::is_none")]
    pub(crate) checksum: Option<String>,
}

impl PartRef {
    /// Its store name, in upload `upload` of `bucket/key`.
    pub(crate) fn store_name(&self, bucket: &str, key: &str, upload: &str) -> String {
        part_name(bucket, key, upload, self.number, self.attempt.as_deref())
    }
}

/// The metadata an opened store object carries.
pub(crate) fn meta_of(opened: &Opened) -> ObjectMeta {
    let record = &opened.record;
    ObjectMeta::from_record(record.size, record.crc, &record.attributes)
}

/// The store name of `key` in `bucket`; InvalidArgument if there is none.
pub(crate) fn name_of(bucket: &str, key: &str) -> S3Result<String> {
    object_name(bucket, key).map_err(|why| {
        let code = match why {
            NameError::BadKey(_) => S3ErrorCode::InvalidArgument,
            NameError::TooLarge { .. } => S3ErrorCode::MetadataTooLarge,
        };
        s3(code, format!("key {key:?} of bucket '{bucket}': {why}"))
    })
}

/// Starts reading `opened`'s bytes of `span` in a task of its own (chunk
/// by chunk, each checked before it is passed on, if `by_chunks`, even
/// for the whole object); returns the first piece (`None`: the read sent
/// nothing and succeeded) and the channel the rest comes on.
pub(crate) async fn start_read(
    client: Arc<Client>,
    opened: Opened,
    span: std::ops::Range<u64>,
    by_chunks: bool,
) -> (Option<Piece>, mpsc::Receiver<Piece>) {
    let (sender, mut receiver) = mpsc::channel(PIECES_IN_FLIGHT);
    let failures = sender.clone();
    tokio::spawn(async move {
        if let Err(e) = read_span(&client, &opened, &sender, span, by_chunks).await {
            // Nobody listens any more if the S3 client went away.
            let _ = failures.send(Piece::Failed(e)).await;
        }
    });
    let first = receiver.recv().await;
    (first, receiver)
}

/// The upload whose manifest the store name `name` holds, if it holds
/// one: its parts must go once the name holds something else. A lookup
/// that fails counts as none (the cleaner finds such parts later).
pub(crate) async fn previous_upload(client: &Client, name: &str) -> Option<String> {
    let record = client.stat(name).await.ok()?;
    let meta = ObjectMeta::from_record(record.size, record.crc, &record.attributes);
    meta.multipart.map(|multipart| multipart.upload)
}

/// What uses an upload's parts.
pub(crate) enum Use {
    /// The upload is pending.
    Pending,
    /// The key's object is the upload's manifest, of this many parts.
    Object(u32),
    /// Nothing: the upload was aborted, or its object replaced.
    Unused,
    /// The store could not tell: leave them.
    Unknown,
}

/// What uses the parts of `upload` of `key`. The state is looked at
/// first: a Complete writes the manifest before it forgets the upload.
pub(crate) async fn parts_use(client: &Client, bucket: &str, key: &str, upload: &str) -> Use {
    match client.stat(&upload_name(bucket, key, upload)).await {
        Ok(_) => return Use::Pending,
        Err(e) if is_missing(&e) => {}
        Err(_) => return Use::Unknown,
    }
    let Ok(name) = name_of(bucket, key) else {
        return Use::Unused;
    };
    match client.stat(&name).await {
        Ok(record) => {
            let meta = ObjectMeta::from_record(record.size, record.crc, &record.attributes);
            match meta.multipart {
                Some(multipart) if multipart.upload == upload => Use::Object(multipart.parts),
                _ => Use::Unused,
            }
        }
        Err(e) if is_missing(&e) => Use::Unused,
        Err(_) => Use::Unknown,
    }
}

/// The store names of the parts the key's manifest lists if it is
/// `upload`'s;
/// `Ok(None)` if the key holds no manifest of it, `Err` if the store
/// could not tell.
pub(crate) async fn manifest_parts(
    client: &Client,
    bucket: &str,
    key: &str,
    upload: &str,
) -> Result<Option<HashSet<String>>, Error> {
    let Ok(name) = name_of(bucket, key) else {
        return Ok(None);
    };
    let opened = match client.open(&name).await {
        Ok(opened) => opened,
        Err(e) if is_missing(&e) => return Ok(None),
        Err(e) => return Err(e),
    };
    let meta = meta_of(&opened);
    if meta
        .multipart
        .is_none_or(|multipart| multipart.upload != upload)
    {
        return Ok(None);
    }
    let manifest = read_manifest(client, &opened).await?;
    Ok(Some(
        manifest
            .parts
            .iter()
            .map(|part| part.store_name(bucket, key, upload))
            .collect(),
    ))
}

/// Forgets an upload and deletes its parts, but those of its object: a
/// Complete that wrote the manifest then stopped (its gateway died)
/// left the upload pending, and only the parts it left out may go.
/// Failures are logged: the cleaner retries.
pub(crate) async fn discard_upload(client: &Client, bucket: &str, key: &str, upload: &str) {
    let used = match manifest_parts(client, bucket, key, upload).await {
        Ok(used) => used,
        Err(e) => {
            tracing::warn!(
                "reading '{bucket}/{key}' before discarding upload {upload}: {}",
                e.report()
            );
            return;
        }
    };
    delete_quietly(client, &upload_name(bucket, key, upload)).await;
    match used {
        Some(used) => drop_parts_but(client, bucket, key, upload, &used).await,
        None => drop_parts(client, bucket, key, upload).await,
    }
}

/// Deletes every part of an upload but those named in `kept` (the
/// parts its object's manifest lists). Failures are logged: the cleaner
/// retries.
pub(crate) async fn drop_parts_but(
    client: &Client,
    bucket: &str,
    key: &str,
    upload: &str,
    kept: &HashSet<String>,
) {
    let prefix = parts_prefix(bucket, key, upload);
    let mut cursor = String::new();
    loop {
        let (entries, next) = match client.list(&prefix, &cursor, STORE_PAGE).await {
            Ok(listed) => listed,
            Err(e) => {
                tracing::warn!("listing the parts of upload {upload}: {}", e.report());
                return;
            }
        };
        for entry in entries {
            let ours = parse_part_name(bucket, &entry.name).is_some();
            if ours && !kept.contains(&entry.name) {
                delete_quietly(client, &entry.name).await;
            }
        }
        match next {
            Some(next) => cursor = cursor.max(next),
            None => return,
        }
    }
}

/// Deletes every part of an upload. Failures are logged: the cleaner
/// deletes what is left.
pub(crate) async fn drop_parts(client: &Client, bucket: &str, key: &str, upload: &str) {
    let prefix = parts_prefix(bucket, key, upload);
    loop {
        let entries = match client.list(&prefix, "", STORE_PAGE).await {
            Ok((entries, _)) => entries,
            Err(e) => {
                tracing::warn!("listing the parts of upload {upload}: {}", e.report());
                return;
            }
        };
        if entries.is_empty() {
            return;
        }
        for entry in &entries {
            if let Err(e) = client.delete(&entry.name).await {
                if !is_missing(&e) {
                    tracing::warn!("deleting part '{}': {}", entry.name, e.report());
                    return;
                }
            }
        }
    }
}

/// Deletes `name`, logging a failure (the cleaner retries it).
pub(crate) async fn delete_quietly(client: &Client, name: &str) {
    match client.delete(name).await {
        Ok(_) => {}
        Err(e) if is_missing(&e) => {}
        Err(e) => tracing::warn!("deleting '{name}': {}", e.report()),
    }
}

/// Starts reading the bytes of `span` of the object `opened` (of
/// `bucket`/`key`, with metadata `meta`) in a task of its own: a plain
/// object's from a replica, a manifest's part by part. Returns the first
/// piece (`None`: nothing to send, and no failure) and the channel the
/// rest comes on.
pub(crate) async fn start_object_read(
    client: Arc<Client>,
    bucket: &str,
    key: &str,
    opened: Opened,
    meta: &ObjectMeta,
    span: Range<u64>,
) -> (Option<Piece>, mpsc::Receiver<Piece>) {
    let Some(multipart) = &meta.multipart else {
        return start_read(client, opened, span, false).await;
    };
    let manifest = match read_manifest(&client, &opened).await {
        Ok(manifest) => manifest,
        Err(e) => {
            let (_, receiver) = mpsc::channel(1);
            return (Some(Piece::Failed(e)), receiver);
        }
    };
    let parts = manifest
        .parts
        .into_iter()
        .map(|part| (part.store_name(bucket, key, &multipart.upload), part))
        .collect();
    start_parts_read(client, parts, span).await
}

/// A manifest's body, read from a replica.
pub(crate) async fn read_manifest(client: &Client, opened: &Opened) -> Result<Manifest, Error> {
    let name = &opened.record.name;
    if opened.record.size > MAX_MANIFEST {
        return Err(Error::Peer(format!(
            "'{name}' is marked a multipart manifest but holds {} bytes: not one this \
             gateway wrote",
            opened.record.size
        )));
    }
    let mut bytes = std::io::Cursor::new(Vec::with_capacity(opened.record.size as usize));
    client.read(opened, &mut bytes, &|_| {}).await?;
    serde_json::from_slice(bytes.get_ref())
        .map_err(|e| Error::Peer(format!("the multipart manifest '{name}' is not valid: {e}")))
}

/// Streams the bytes of `span` of the concatenated `parts` (store name
/// and manifest entry), one part after the other.
pub(crate) async fn start_parts_read(
    client: Arc<Client>,
    parts: Vec<(String, PartRef)>,
    span: Range<u64>,
) -> (Option<Piece>, mpsc::Receiver<Piece>) {
    let (sender, mut receiver) = mpsc::channel(PIECES_IN_FLIGHT);
    tokio::spawn(async move {
        let mut start = 0u64;
        for (name, part) in parts {
            let end = start + part.size;
            let (from, to) = (span.start.max(start), span.end.min(end));
            if from < to {
                let local = from - start..to - start;
                if let Err(e) = read_part(&client, &name, &part, &sender, local).await {
                    // Nobody listens any more if the S3 client went away.
                    let _ = sender.send(Piece::Failed(e)).await;
                    return;
                }
            }
            start = end;
        }
    });
    let first = receiver.recv().await;
    (first, receiver)
}

/// Sends the bytes of `span` of one part to `sender`, if the part is
/// still the version the manifest names.
pub(crate) async fn read_part(
    client: &Client,
    name: &str,
    part: &PartRef,
    sender: &mpsc::Sender<Piece>,
    span: Range<u64>,
) -> Result<(), Error> {
    let opened = client.open(name).await?;
    if opened.record.version != part.version || opened.record.size != part.size {
        return Err(Error::Peer(format!(
            "part {} ('{name}') was replaced after its upload completed (an UploadPart racing \
             the Complete): the object cannot be read whole; upload it again",
            part.number
        )));
    }
    read_span(client, &opened, sender, span, false).await
}

/// Sends the bytes of `span` of `opened` to `sender`: the whole object
/// read as such (a whole read may come from a node's object cache or
/// this process's disk), a part of it as a ranged read, which reads
/// only the chunks covering it (the whole too, if `by_chunks`).
async fn read_span(
    client: &Client,
    opened: &Opened,
    sender: &mpsc::Sender<Piece>,
    span: Range<u64>,
    by_chunks: bool,
) -> Result<(), Error> {
    if span.is_empty() {
        return Ok(());
    }
    if span == (0..opened.record.size) && !by_chunks {
        let mut sink = Sink::new(sender.clone(), span);
        return client.read(opened, &mut sink, &|_| {}).await;
    }
    // The ranged read writes the span's bytes alone, each checked first.
    let mut sink = Sink::new(sender.clone(), 0..span.end - span.start);
    client.read_range(opened, span, &mut sink, &|_| {}).await
}
