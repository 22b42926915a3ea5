//! Objects: Put, Get (with Range and the conditional headers), Head and
//! Delete, each on the store names of [`crate::names`].

use crate::buckets::{check_scope, from_ms, now_ms};
use crate::errors::{from_store, is_missing, s3};
use crate::names::{key_prefix, newest, object_name, parse_object_name, ObjectMeta};
use crate::{Gateway, MAX_OBJECT_BYTES};
use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use bytes::Bytes;
use futures::StreamExt;
use md5::{Digest, Md5};
use s3s::dto::{ETag, ETagCondition, Range, StreamingBlob, Timestamp};
use s3s::{S3ErrorCode, S3Result};
use std::collections::BTreeMap;
use strata_store_client::client::Client;

/// How often a Get looks its key up again when the name it found was
/// replaced by an overwrite before its data was read.
const LOOKUP_ATTEMPTS: usize = 3;

/// A PutObject's fields the gateway keeps.
pub(crate) struct PutRequest {
    /// The bucket.
    pub bucket: String,
    /// The key.
    pub key: String,
    /// The body as it arrives.
    pub body: Option<StreamingBlob>,
    /// Content-Length, if given.
    pub content_length: Option<i64>,
    /// Content-MD5 (base64), if given.
    pub content_md5: Option<String>,
    /// Content-Type, if given.
    pub content_type: Option<String>,
    /// The `x-amz-meta-*` headers.
    pub metadata: BTreeMap<String, String>,
}

/// The conditional headers of a Get or Head.
#[derive(Default)]
pub(crate) struct Conditions {
    /// If-Match.
    pub if_match: Option<ETagCondition>,
    /// If-None-Match.
    pub if_none_match: Option<ETagCondition>,
    /// If-Modified-Since.
    pub if_modified_since: Option<Timestamp>,
    /// If-Unmodified-Since.
    pub if_unmodified_since: Option<Timestamp>,
}

/// An object found under its key: its store name and metadata.
pub(crate) struct Found {
    /// The store name.
    pub name: String,
    /// What the name carries.
    pub meta: ObjectMeta,
}

/// An object read back: its metadata, the bytes served and, for a Range,
/// the range served.
pub(crate) struct Read {
    /// The object's metadata.
    pub meta: ObjectMeta,
    /// The bytes served.
    pub body: Bytes,
    /// `bytes FIRST-LAST/SIZE` for a Range.
    pub content_range: Option<String>,
}

/// The S3 ETag of `meta`.
pub(crate) fn etag(meta: &ObjectMeta) -> ETag {
    ETag::Strong(meta.etag.clone())
}

/// The Last-Modified of `meta`.
pub(crate) fn last_modified(meta: &ObjectMeta) -> Timestamp {
    Timestamp::from(from_ms(meta.modified_ms))
}

impl Gateway {
    /// PutObject: reads the body (at most [`MAX_OBJECT_BYTES`]), checks
    /// its Content-MD5, posts it under its name, then deletes the key's
    /// older names. Returns the metadata stored.
    pub(crate) async fn put_object(
        &self,
        client: &Client,
        request: PutRequest,
    ) -> S3Result<ObjectMeta> {
        let PutRequest {
            bucket,
            key,
            body,
            content_length,
            content_md5: md5_header,
            content_type,
            metadata,
        } = request;
        let (bucket, key) = (bucket.as_str(), key.as_str());
        self.bucket_exists(client, bucket).await?;
        crate::names::check_key(key)
            .map_err(|why| s3(S3ErrorCode::InvalidArgument, format!("key {key:?}: {why}")))?;
        let expected = content_md5(md5_header.as_deref())?;
        let data = read_body(body, content_length).await?;
        let digest: [u8; 16] = Md5::digest(&data).into();
        if expected.is_some_and(|md5| md5 != digest) {
            return Err(s3(
                S3ErrorCode::BadDigest,
                format!(
                    "the Content-MD5 given for '{bucket}/{key}' is not the MD5 of the {} bytes \
                     received; nothing was stored",
                    data.len()
                ),
            ));
        }
        let meta = ObjectMeta {
            etag: digest.iter().map(|b| format!("{b:02x}")).collect(),
            size: data.len() as u64,
            modified_ms: now_ms(),
            content_type,
            metadata,
        };
        let name = object_name(bucket, key, &meta).map_err(|why| {
            let code = match why {
                crate::names::NameError::TooLong { .. } => S3ErrorCode::MetadataTooLarge,
                crate::names::NameError::ReservedByte => S3ErrorCode::InvalidArgument,
            };
            s3(code, format!("key {key:?}: {why}"))
        })?;
        let mut reader = &data[..];
        client
            .put(&name, data.len() as u64, &mut reader, &|_| {})
            .await
            .map_err(|e| from_store(&format!("storing '{bucket}/{key}'"), &e))?;
        self.drop_older(client, bucket, key).await;
        Ok(meta)
    }

    /// Deletes every name of the key but the newest (an overwrite's old
    /// names). A failure leaves an older name, which readers pass over.
    async fn drop_older(&self, client: &Client, bucket: &str, key: &str) {
        let names = match self.names_of(client, bucket, key).await {
            Ok(names) => names,
            Err(e) => {
                tracing::warn!("listing '{bucket}/{key}' after a Put: {}", e.report());
                return;
            }
        };
        let keep = newest(names.iter().map(|(n, m)| (n.as_str(), m))).map(str::to_string);
        for (name, _) in &names {
            if Some(name) != keep.as_ref() {
                if let Err(e) = client.delete(name).await {
                    if !is_missing(&e) {
                        tracing::warn!(
                            "deleting an older name of '{bucket}/{key}': {}",
                            e.report()
                        );
                    }
                }
            }
        }
    }

    /// Every store name of the key, with its metadata.
    async fn names_of(
        &self,
        client: &Client,
        bucket: &str,
        key: &str,
    ) -> Result<Vec<(String, ObjectMeta)>, strata_store_protocol::Error> {
        let prefix = key_prefix(bucket, key);
        let mut found = Vec::new();
        let mut after = String::new();
        loop {
            let (entries, cursor) = client.list(&prefix, &after, 1000).await?;
            for entry in entries {
                if let Some((k, meta)) = parse_object_name(bucket, &entry.name) {
                    if k == key {
                        found.push((entry.name, meta));
                    }
                }
            }
            match cursor {
                Some(cursor) => after = cursor,
                None => return Ok(found),
            }
        }
    }

    /// The key's newest name; NoSuchKey (or NoSuchBucket) if none.
    pub(crate) async fn find(&self, client: &Client, bucket: &str, key: &str) -> S3Result<Found> {
        check_scope(client, bucket)?;
        let names = self
            .names_of(client, bucket, key)
            .await
            .map_err(|e| from_store(&format!("looking up '{bucket}/{key}'"), &e))?;
        let keep = newest(names.iter().map(|(n, m)| (n.as_str(), m))).map(str::to_string);
        match names
            .into_iter()
            .find(|(name, _)| Some(name) == keep.as_ref())
        {
            Some((name, meta)) => Ok(Found { name, meta }),
            None => {
                self.bucket_exists(client, bucket).await?;
                Err(s3(
                    S3ErrorCode::NoSuchKey,
                    format!("no object '{key}' in bucket '{bucket}'"),
                ))
            }
        }
    }

    /// HeadObject: the key's metadata, after its conditions.
    pub(crate) async fn head_object(
        &self,
        client: &Client,
        bucket: &str,
        key: &str,
        conditions: &Conditions,
    ) -> S3Result<ObjectMeta> {
        let found = self.find(client, bucket, key).await?;
        check_conditions(&found.meta, conditions)?;
        Ok(found.meta)
    }

    /// GetObject: the key's bytes (or the range asked), after its
    /// conditions.
    pub(crate) async fn get_object(
        &self,
        client: &Client,
        bucket: &str,
        key: &str,
        conditions: &Conditions,
        range: Option<&Range>,
    ) -> S3Result<Read> {
        for _ in 0..LOOKUP_ATTEMPTS {
            let found = self.find(client, bucket, key).await?;
            check_conditions(&found.meta, conditions)?;
            let span = match range {
                Some(range) => Some(range.check(found.meta.size).map_err(|_| {
                    s3(
                        S3ErrorCode::InvalidRange,
                        format!(
                            "the range asked is outside '{bucket}/{key}', which holds {} bytes",
                            found.meta.size
                        ),
                    )
                })?),
                None => None,
            };
            let bytes = match client.get_bytes(&found.name).await {
                Ok((_, bytes)) => bytes,
                // Replaced by an overwrite meanwhile: look the key up again.
                Err(e) if is_missing(&e) => continue,
                Err(e) => return Err(from_store(&format!("reading '{bucket}/{key}'"), &e)),
            };
            if bytes.len() as u64 != found.meta.size {
                return Err(s3(
                    S3ErrorCode::InternalError,
                    format!(
                        "'{bucket}/{key}' holds {} bytes in the store, but its name says {}",
                        bytes.len(),
                        found.meta.size
                    ),
                ));
            }
            let mut body = Bytes::from(bytes);
            let content_range = span.map(|span| {
                body = body.slice(span.start as usize..span.end as usize);
                format!("bytes {}-{}/{}", span.start, span.end - 1, found.meta.size)
            });
            return Ok(Read {
                meta: found.meta,
                body,
                content_range,
            });
        }
        Err(s3(
            S3ErrorCode::ServiceUnavailable,
            format!("'{bucket}/{key}' was overwritten during every read; retry"),
        ))
    }

    /// DeleteObject: every name of the key (none is not an error, as in S3).
    pub(crate) async fn delete_object(
        &self,
        client: &Client,
        bucket: &str,
        key: &str,
    ) -> S3Result<()> {
        check_scope(client, bucket)?;
        let names = self
            .names_of(client, bucket, key)
            .await
            .map_err(|e| from_store(&format!("looking up '{bucket}/{key}'"), &e))?;
        if names.is_empty() {
            return self.bucket_exists(client, bucket).await;
        }
        for (name, _) in names {
            match client.delete(&name).await {
                Ok(_) => {}
                Err(e) if is_missing(&e) => {}
                Err(e) => return Err(from_store(&format!("deleting '{bucket}/{key}'"), &e)),
            }
        }
        Ok(())
    }
}

/// The 16 bytes of a Content-MD5 header; InvalidDigest if it is not the
/// base64 of 16 bytes.
fn content_md5(header: Option<&str>) -> S3Result<Option<[u8; 16]>> {
    let Some(text) = header else {
        return Ok(None);
    };
    let bytes = STANDARD.decode(text.trim()).unwrap_or_default();
    let digest: [u8; 16] = bytes.try_into().map_err(|_| {
        s3(
            S3ErrorCode::InvalidDigest,
            format!("Content-MD5 {text:?} is not the base64 of a 16-byte MD5"),
        )
    })?;
    Ok(Some(digest))
}

/// Reads a Put's body: at most [`MAX_OBJECT_BYTES`], and exactly its
/// Content-Length when one was given.
async fn read_body(body: Option<StreamingBlob>, declared: Option<i64>) -> S3Result<Vec<u8>> {
    if let Some(length) = declared {
        if length < 0 || length as u64 > MAX_OBJECT_BYTES {
            return Err(too_large());
        }
    }
    let Some(body) = body else {
        return Ok(Vec::new());
    };
    // Bounded: the capacity is the declared length, at most
    // MAX_OBJECT_BYTES (checked above).
    let mut data = Vec::with_capacity(declared.unwrap_or(0).max(0) as usize);
    let mut body = body;
    while let Some(chunk) = body.next().await {
        let chunk = chunk.map_err(|e| {
            s3(
                S3ErrorCode::IncompleteBody,
                format!("the request body ended early or could not be read: {e}"),
            )
        })?;
        if (data.len() + chunk.len()) as u64 > MAX_OBJECT_BYTES {
            return Err(too_large());
        }
        data.extend_from_slice(&chunk);
    }
    if declared.is_some_and(|length| length as u64 != data.len() as u64) {
        return Err(s3(
            S3ErrorCode::IncompleteBody,
            format!(
                "the body held {} bytes, not the {} of its Content-Length; nothing was stored",
                data.len(),
                declared.unwrap_or(0)
            ),
        ));
    }
    Ok(data)
}

fn too_large() -> s3s::S3Error {
    s3(
        S3ErrorCode::EntityTooLarge,
        format!("objects through this gateway hold at most {MAX_OBJECT_BYTES} bytes"),
    )
}

/// Applies the conditional headers as S3 does: If-Match then
/// If-Unmodified-Since (412), If-None-Match then If-Modified-Since (304).
fn check_conditions(meta: &ObjectMeta, conditions: &Conditions) -> S3Result<()> {
    let matches = |condition: &ETagCondition| match condition {
        ETagCondition::Any => true,
        ETagCondition::ETag(tag) => tag.value() == meta.etag,
    };
    let modified_s = meta.modified_ms / 1000;
    let seconds = |t: &Timestamp| {
        let t: time::OffsetDateTime = t.clone().into();
        t.unix_timestamp().max(0) as u64
    };
    if let Some(condition) = &conditions.if_match {
        if !matches(condition) {
            return Err(precondition("If-Match names another ETag"));
        }
    } else if let Some(since) = &conditions.if_unmodified_since {
        if modified_s > seconds(since) {
            return Err(precondition(
                "the object was modified after If-Unmodified-Since",
            ));
        }
    }
    if let Some(condition) = &conditions.if_none_match {
        if matches(condition) {
            return Err(s3(
                S3ErrorCode::NotModified,
                "If-None-Match matches the ETag",
            ));
        }
    } else if let Some(since) = &conditions.if_modified_since {
        if modified_s <= seconds(since) {
            return Err(s3(
                S3ErrorCode::NotModified,
                "the object was not modified after If-Modified-Since",
            ));
        }
    }
    Ok(())
}

fn precondition(why: &str) -> s3s::S3Error {
    s3(S3ErrorCode::PreconditionFailed, why.to_string())
}
