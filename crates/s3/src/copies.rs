//! CopyObject. The store has renames, not copies, so a copy reads the
//! source from a replica and streams it into a new Post of the
//! destination, as a PutObject of those bytes would: the gateway holds
//! at most a few store chunks of it at a time, and a copy that fails
//! midway (the source's replica damaged, the store unavailable) aborts
//! the Post, so the destination keeps what it held.

use crate::buckets::{check_scope, now_ms};
use crate::errors::{from_store, s3};
use crate::names::ObjectMeta;
use crate::objects::{check_conditions, check_fits, meta_of, name_of, Conditions, LOOKUP_ATTEMPTS};
use crate::parts::{drop_parts, previous_upload, start_object_read};
use crate::posts::{post, Target};
use crate::streams::{lock, response_body, BodyReader, Piece, Received};
use crate::Gateway;
use md5::Digest;
use s3s::dto::StreamingBlob;
use s3s::{S3Error, S3ErrorCode, S3Result};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use strata_store_client::client::{Client, Opened};
use strata_store_protocol::Error;

/// A CopyObject's fields the gateway keeps.
pub(crate) struct CopyRequest {
    /// The source's bucket.
    pub source_bucket: String,
    /// The source's key.
    pub source_key: String,
    /// The destination's bucket.
    pub bucket: String,
    /// The destination's key.
    pub key: String,
    /// With `MetadataDirective=REPLACE`, the destination's metadata;
    /// without, the source's is kept.
    pub replacement: Option<Replacement>,
    /// The `x-amz-copy-source-if-*` headers, on the source.
    pub conditions: Conditions,
}

/// The metadata a copy with `MetadataDirective=REPLACE` gives its
/// destination.
pub(crate) struct Replacement {
    /// Content-Type.
    pub content_type: Option<String>,
    /// The `x-amz-meta-*` headers.
    pub metadata: BTreeMap<String, String>,
}

impl Gateway {
    /// CopyObject: the source's bytes streamed into a new object at the
    /// destination, with the source's ETag and its metadata (or the
    /// replacement's). Returns the metadata stored.
    pub(crate) async fn copy_object(
        &self,
        client: &Arc<Client>,
        request: &CopyRequest,
    ) -> S3Result<ObjectMeta> {
        let (bucket, key) = (request.bucket.as_str(), request.key.as_str());
        check_scope(client, bucket)?;
        let onto_itself = bucket == request.source_bucket && key == request.source_key;
        if onto_itself && request.replacement.is_none() {
            return Err(s3(
                S3ErrorCode::InvalidRequest,
                format!(
                    "copying '{bucket}/{key}' onto itself changes nothing: give \
                     MetadataDirective=REPLACE with the new metadata"
                ),
            ));
        }
        let class = self.bucket_class(client, bucket).await?;
        let name = name_of(bucket, key)?;
        for _ in 0..LOOKUP_ATTEMPTS {
            let opened = self
                .find(client, &request.source_bucket, &request.source_key)
                .await?;
            let source = meta_of(&opened);
            let meta = destination_meta(&source, request)?;
            let version = opened.record.version;
            let (source_bucket, source_key) = (&request.source_bucket, &request.source_key);
            let read = read_source(client, source_bucket, source_key, opened, &source).await;
            let Some(body) = read else {
                // The version found was overwritten before it was read.
                let (source_bucket, source_key) = (&request.source_bucket, &request.source_key);
                if self
                    .replaced(client, source_bucket, source_key, version)
                    .await
                {
                    continue;
                }
                return Err(s3(
                    S3ErrorCode::ServiceUnavailable,
                    format!("'{source_bucket}/{source_key}' could not be read; retry"),
                ));
            };
            let previous = previous_upload(client, &name).await;
            let target = Target {
                name: &name,
                size: meta.size,
                class,
            };
            let stored = store_copy(client, &target, meta, body).await?;
            if let Some(previous) = previous {
                drop_parts(client, bucket, key, &previous).await;
            }
            return Ok(stored);
        }
        Err(s3(
            S3ErrorCode::ServiceUnavailable,
            format!(
                "'{}/{}' was overwritten during every copy; retry",
                request.source_bucket, request.source_key
            ),
        ))
    }
}

/// Applies the `x-amz-copy-source-if-*` headers to the source: those
/// that do not hold answer PreconditionFailed (S3 answers 412 for all
/// four, never 304).
pub(crate) fn check_copy_conditions(source: &ObjectMeta, conditions: &Conditions) -> S3Result<()> {
    check_conditions(source, conditions).map_err(|e| {
        if *e.code() == S3ErrorCode::NotModified {
            s3(
                S3ErrorCode::PreconditionFailed,
                e.message().unwrap_or_default().to_string(),
            )
        } else {
            e
        }
    })
}

/// The destination's metadata: the source's ETag and size, now as its
/// time, and the source's content type and user metadata unless they
/// are replaced; a copy of a multipart object is one plain object, with
/// the source's multipart ETag. Copy conditions are checked first.
fn destination_meta(source: &ObjectMeta, request: &CopyRequest) -> S3Result<ObjectMeta> {
    check_copy_conditions(source, &request.conditions)?;
    let (content_type, metadata) = match &request.replacement {
        Some(replacement) => (
            replacement.content_type.clone(),
            replacement.metadata.clone(),
        ),
        None => (source.content_type.clone(), source.metadata.clone()),
    };
    let meta = ObjectMeta {
        etag: source.etag.clone(),
        size: source.size,
        modified_ms: now_ms(),
        content_type,
        metadata,
        multipart: None,
        // The bytes are the source's: so is a whole-object checksum (a
        // multipart source's composite describes parts the copy lacks).
        checksum: source.checksum.clone().filter(|kept| !kept.is_composite()),
    };
    check_fits(&meta, &request.bucket, &request.key)?;
    Ok(meta)
}

/// The source's bytes as a stream, once the first came; `None` if the
/// read failed before any (the version may have been overwritten).
async fn read_source(
    client: &Arc<Client>,
    bucket: &str,
    key: &str,
    opened: Opened,
    meta: &ObjectMeta,
) -> Option<StreamingBlob> {
    let span = 0..meta.size;
    let (first, receiver) =
        start_object_read(client.clone(), bucket, key, opened, meta, span).await;
    match first {
        None => Some(StreamingBlob::from(s3s::Body::from(bytes::Bytes::new()))),
        Some(Piece::Data(first)) => Some(response_body(first, receiver)),
        Some(Piece::Failed(e)) => {
            tracing::debug!("reading the source of a copy: {}", e.report());
            None
        }
    }
}

/// Posts `body` as the store object `target` names, in its class, with
/// `meta`. The bytes are
/// hashed on the way: a source whose ETag is an MD5 must match it, so a
/// copy never gives other bytes the source's ETag.
async fn store_copy(
    client: &Client,
    target: &Target<'_>,
    meta: ObjectMeta,
    body: StreamingBlob,
) -> S3Result<ObjectMeta> {
    let name = target.name;
    let size = meta.size;
    let received = Arc::new(Mutex::new(Received::default()));
    let mut reader = BodyReader::new(Some(body), received.clone());
    let finish = || {
        let digest: [u8; 16] = lock(&received).md5.clone().finalize().into();
        let md5: String = digest.iter().map(|b| format!("{b:02x}")).collect();
        if is_md5(&meta.etag) && md5 != meta.etag {
            return Err(Error::Peer(format!(
                "the {size} bytes read have the MD5 {md5}, not the source's ETag {}; \
                 nothing was stored",
                meta.etag
            )));
        }
        meta.attributes()
            .map_err(|why| Error::Peer(why.to_string()))
    };
    match post(client, target, &mut reader, finish).await {
        Ok(_) => Ok(meta),
        Err(e) => Err(copy_error(name, size, &received, &e)),
    }
}

/// Whether `etag` is an MD5 (32 hex digits), as the gateway's single-part
/// objects have; an object stored without the gateway has its CRC-32C.
fn is_md5(etag: &str) -> bool {
    etag.len() == 32 && etag.bytes().all(|b| b.is_ascii_hexdigit())
}

/// The S3 error of a failed copy: the source's read broke or ended
/// early (InternalError: the store's replica or link failed), or the
/// store refused the Post.
fn copy_error(name: &str, size: u64, received: &Mutex<Received>, error: &Error) -> S3Error {
    let received = lock(received);
    if let Some(why) = &received.failed {
        return s3(
            S3ErrorCode::InternalError,
            format!("copying to '{name}': {why}; nothing was stored, retry the copy"),
        );
    }
    if received.bytes < size {
        return s3(
            S3ErrorCode::InternalError,
            format!(
                "copying to '{name}': the source gave {} of its {size} bytes; nothing was \
                 stored, retry the copy",
                received.bytes
            ),
        );
    }
    from_store(&format!("copying to '{name}'"), error)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_32_hex_digits_are_an_md5() {
        assert!(is_md5("d41d8cd98f00b204e9800998ecf8427e"));
        assert!(!is_md5("00abcdef"));
        assert!(!is_md5("d41d8cd98f00b204e9800998ecf8427e-2"));
        assert!(!is_md5("z41d8cd98f00b204e9800998ecf8427e"));
    }
}
