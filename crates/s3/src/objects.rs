//! Objects: Put, Get (with Range and the conditional headers), Head and
//! Delete, each on the store object `B/K` ([`crate::names`]), whose
//! record carries the S3 metadata.

use crate::buckets::{check_scope, from_ms, now_ms};
use crate::checksums::{ChecksumClaims, KeptChecksum};
use crate::errors::{from_store, is_missing, s3};
use crate::names::ObjectMeta;
use crate::part_number::{part_span, PartSpan};
use crate::parts::{drop_parts, previous_upload, start_object_read, start_read};
pub(crate) use crate::parts::{meta_of, name_of};
use crate::posts::{post, Target};
use crate::streams::{lock, region_body, response_body, BodyReader, Piece, Received};
use crate::Gateway;
use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use bytes::Bytes;
use md5::Digest;
use s3s::dto::{ETag, ETagCondition, Range, StreamingBlob, Timestamp};
use s3s::stream::ByteStream;
use s3s::{S3ErrorCode, S3Result};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use strata_store_client::client::local::{CheckedRegion, LocalCheck};
use strata_store_client::client::{Client, Opened};
use strata_store_protocol::wire::MAX_OBJECT;
use strata_store_protocol::Error;

/// How often a Get looks its key up again when the version it found was
/// replaced by an overwrite before its data was read.
pub(crate) const LOOKUP_ATTEMPTS: usize = 3;

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
    /// The `x-amz-checksum-*` headers and trailers, checked against the
    /// body, and the algorithm of the checksum to keep with it.
    pub checksums: ChecksumClaims,
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

/// An object being read: its metadata, the body streamed from the store
/// and, for a Range, the range served.
pub(crate) struct Read {
    /// The object's metadata.
    pub meta: ObjectMeta,
    /// The bytes served, as they come from the store.
    pub body: StreamingBlob,
    /// How many bytes `body` holds.
    pub length: u64,
    /// `bytes FIRST-LAST/SIZE` for a Range or a part.
    pub content_range: Option<String>,
    /// The object's part count, when a part was asked.
    pub parts_count: Option<u32>,
    /// The part's own checksum, when a part was asked and has one.
    pub part_checksum: Option<KeptChecksum>,
    /// The whole object as a checked region of a replica file on this
    /// process's disk: the connection sends it with `sendfile`
    /// ([`crate::front`]) rather than `body`, which reads the same bytes.
    pub region: Option<CheckedRegion>,
}

/// The S3 ETag of `meta`.
pub(crate) fn etag(meta: &ObjectMeta) -> ETag {
    ETag::Strong(meta.etag.clone())
}

/// The Content-Type of `meta`: the one stored, else S3's default for an
/// object put without one (what S3 and RGW answer too).
pub(crate) fn content_type(meta: &ObjectMeta) -> String {
    meta.content_type
        .clone()
        .unwrap_or_else(|| DEFAULT_CONTENT_TYPE.to_string())
}

/// What S3 answers as the Content-Type of an object stored without one.
pub(crate) const DEFAULT_CONTENT_TYPE: &str = "binary/octet-stream";

/// The Last-Modified of `meta`.
pub(crate) fn last_modified(meta: &ObjectMeta) -> Timestamp {
    Timestamp::from(from_ms(meta.modified_ms))
}

/// Refuses an object whose S3 metadata does not fit the store record's
/// attributes, before any byte of it is stored.
pub(crate) fn check_fits(meta: &ObjectMeta, bucket: &str, key: &str) -> S3Result<()> {
    meta.attributes().map(|_| ()).map_err(|why| {
        s3(
            S3ErrorCode::MetadataTooLarge,
            format!("'{bucket}/{key}': {why}"),
        )
    })
}

impl Gateway {
    /// PutObject: streams the body into the store object `B/K`
    /// ([`store_body`]); a multipart object it replaces loses its parts.
    /// Returns the metadata stored.
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
            checksums,
        } = request;
        let (bucket, key) = (bucket.as_str(), key.as_str());
        let class = self.bucket_class(client, bucket).await?;
        let name = name_of(bucket, key)?;
        let expected = content_md5(md5_header.as_deref())?;
        let size = body_size(&body, content_length, MAX_OBJECT)?;
        let meta = ObjectMeta {
            // An MD5's length (and a checksum's): the attributes are
            // checked before the body is read, and the digests fill these
            // in once it is.
            etag: "0".repeat(32),
            size,
            modified_ms: now_ms(),
            content_type,
            metadata,
            multipart: None,
            checksum: checksums
                .keep
                .map(|algorithm| KeptChecksum::placeholder(algorithm, 0)),
        };
        check_fits(&meta, bucket, key)?;
        let previous = previous_upload(client, &name).await;
        let what = format!("'{bucket}/{key}'");
        let claims = Claims {
            md5: expected,
            checksums,
        };
        let target = Target {
            name: &name,
            size,
            class,
        };
        let meta = store_body(client, &target, &what, body, claims, meta).await?;
        if let Some(previous) = previous {
            drop_parts(client, bucket, key, &previous).await;
        }
        Ok(meta)
    }

    /// The key's store object, looked up for reading; NoSuchKey (or
    /// NoSuchBucket) if there is none.
    pub(crate) async fn find(&self, client: &Client, bucket: &str, key: &str) -> S3Result<Opened> {
        check_scope(client, bucket)?;
        let name = name_of(bucket, key)?;
        match client.open(&name).await {
            Ok(opened) => Ok(opened),
            Err(e) if is_missing(&e) => {
                self.bucket_exists(client, bucket).await?;
                Err(s3(
                    S3ErrorCode::NoSuchKey,
                    format!("no object '{key}' in bucket '{bucket}'"),
                ))
            }
            Err(e) => Err(from_store(&format!("looking up '{bucket}/{key}'"), &e)),
        }
    }

    /// HeadObject: the key's metadata, after its conditions.
    pub(crate) async fn head_object(
        &self,
        client: &Client,
        bucket: &str,
        key: &str,
        conditions: &Conditions,
        part_number: Option<i32>,
    ) -> S3Result<(ObjectMeta, Option<PartSpan>)> {
        let opened = self.find(client, bucket, key).await?;
        let meta = meta_of(&opened);
        check_conditions(&meta, conditions)?;
        let part = match part_number {
            Some(number) => {
                Some(part_span(client, &opened, &meta, (bucket, key), number, false).await?)
            }
            None => None,
        };
        Ok((meta, part))
    }

    /// GetObject: the key's bytes (or the range asked), after its
    /// conditions, streamed from the store. The response starts once
    /// the first bytes came (or the read failed before any): a version
    /// overwritten between the lookup and the read is looked up again.
    pub(crate) async fn get_object(
        &self,
        client: &Arc<Client>,
        bucket: &str,
        key: &str,
        conditions: &Conditions,
        range: Option<&Range>,
        part_number: Option<i32>,
    ) -> S3Result<Read> {
        for _ in 0..LOOKUP_ATTEMPTS {
            let opened = self.find(client, bucket, key).await?;
            let meta = meta_of(&opened);
            check_conditions(&meta, conditions)?;
            let (span, content_range, part) = match part_number {
                Some(number) => {
                    let at = (bucket, key);
                    let part =
                        part_span(client, &opened, &meta, at, number, range.is_some()).await?;
                    let content_range = part.content_range(meta.size);
                    (part.span.clone(), content_range, Some(part))
                }
                None => {
                    let (span, content_range) = range_span(range, &meta, bucket, key)?;
                    (span, content_range, None)
                }
            };
            let length = span.end - span.start;
            let whole = range.is_none() && part.is_none() && meta.multipart.is_none();
            let mut by_chunks = false;
            if whole {
                let region = match client.checked_local(&opened).await {
                    LocalCheck::Passed(region) => Some(region),
                    LocalCheck::Damaged => {
                        // A whole read would try the damaged replica
                        // first and could fail after its first pieces
                        // went out: read each chunk checked instead.
                        by_chunks = true;
                        None
                    }
                    LocalCheck::Absent => None,
                };
                if let Some(region) = region {
                    return Ok(Read {
                        meta,
                        body: region_body(region.clone()),
                        length,
                        content_range,
                        parts_count: None,
                        part_checksum: None,
                        region: Some(region),
                    });
                }
            }
            let version = opened.record.version;
            let (first, receiver) = if by_chunks {
                start_read(client.clone(), opened, span, true).await
            } else {
                start_object_read(client.clone(), bucket, key, opened, &meta, span).await
            };
            let body = match first {
                None => StreamingBlob::from(s3s::Body::from(Bytes::new())),
                Some(Piece::Data(first)) => response_body(first, receiver),
                Some(Piece::Failed(e)) => {
                    if self.replaced(client, bucket, key, version).await {
                        continue;
                    }
                    return Err(from_store(&format!("reading '{bucket}/{key}'"), &e));
                }
            };
            return Ok(Read {
                meta,
                body,
                length,
                content_range,
                parts_count: part.as_ref().map(|part| part.parts),
                part_checksum: part.and_then(|part| part.checksum),
                region: None,
            });
        }
        Err(s3(
            S3ErrorCode::ServiceUnavailable,
            format!("'{bucket}/{key}' was overwritten during every read; retry"),
        ))
    }

    /// Whether the key no longer holds `version` (overwritten or deleted).
    pub(crate) async fn replaced(
        &self,
        client: &Client,
        bucket: &str,
        key: &str,
        version: u64,
    ) -> bool {
        match self.find(client, bucket, key).await {
            Ok(opened) => opened.record.version != version,
            Err(_) => true,
        }
    }

    /// DeleteObject: the key's store object (none is not an error, as in
    /// S3), then, for a multipart object, its parts.
    pub(crate) async fn delete_object(
        &self,
        client: &Client,
        bucket: &str,
        key: &str,
    ) -> S3Result<()> {
        check_scope(client, bucket)?;
        let name = name_of(bucket, key)?;
        let previous = previous_upload(client, &name).await;
        match client.delete(&name).await {
            Ok(_) => {
                if let Some(previous) = previous {
                    drop_parts(client, bucket, key, &previous).await;
                }
                Ok(())
            }
            Err(e) if is_missing(&e) => self.bucket_exists(client, bucket).await,
            Err(e) => Err(from_store(&format!("deleting '{bucket}/{key}'"), &e)),
        }
    }
}

/// Streams `body` (`meta.size` bytes) into the store object `target`
/// names, in its class (the object `what` names, for messages) while its MD5 is computed; once
/// the data is stored, checks it against `expected` (Content-MD5) and
/// commits the record with `meta`, its ETag the MD5, as its attributes.
/// A mismatch or a short body aborts the Post: nothing is stored, and
/// the name keeps what it held. Returns the metadata stored.
pub(crate) async fn store_body(
    client: &Client,
    target: &Target<'_>,
    what: &str,
    body: Option<StreamingBlob>,
    claims: Claims,
    mut meta: ObjectMeta,
) -> S3Result<ObjectMeta> {
    let size = meta.size;
    let received = Arc::new(Mutex::new(Received {
        checksums: claims.checksums.hasher(),
        ..Received::default()
    }));
    let mut reader = BodyReader::new(body, received.clone());
    if claims.checksums.trailers.is_some() {
        reader = reader.draining_at(size);
    }
    let mut refused = None;
    // Computed once: a Post tried again after the store refused it reads
    // no byte twice into the digests.
    let mut digests: Option<([u8; 16], s3s::dto::Checksum)> = None;
    let finish = || {
        let (digest, computed) = digests
            .get_or_insert_with(|| {
                let mut received = lock(&received);
                let digest: [u8; 16] = received.md5.clone().finalize().into();
                let computed = std::mem::take(&mut received.checksums).finalize();
                (digest, computed)
            })
            .clone();
        if claims.md5.is_some_and(|md5| md5 != digest) {
            refused = Some(S3ErrorCode::BadDigest);
            return Err(Error::Peer(format!(
                "the Content-MD5 given for {what} is not the MD5 of the {size} bytes \
                 received; nothing was stored"
            )));
        }
        if let Some(algorithm) = claims.checksums.mismatched(&computed) {
            refused = Some(S3ErrorCode::BadDigest);
            return Err(Error::Peer(format!(
                "the {algorithm} you specified for {what} did not match the calculated \
                 checksum of the {size} bytes received; nothing was stored"
            )));
        }
        meta.etag = digest.iter().map(|b| format!("{b:02x}")).collect();
        meta.checksum = claims.checksums.kept(&computed);
        meta.attributes()
            .map_err(|why| Error::Peer(why.to_string()))
    };
    let stored = post(client, target, &mut reader, finish).await;
    match stored {
        Ok(_) => Ok(meta),
        Err(e) => Err(put_error(what, size, &received, refused, &e)),
    }
}

/// What a Put's request says its body is: its Content-MD5 and its
/// `x-amz-checksum-*` headers or trailers, each checked once the body
/// is read, and the checksum to keep with it.
#[derive(Default)]
pub(crate) struct Claims {
    /// The Content-MD5, decoded.
    pub md5: Option<[u8; 16]>,
    /// The checksums claimed, and the one to keep.
    pub checksums: ChecksumClaims,
}

/// The size a Put's body will have: its Content-Length (0 without a
/// body), at most `largest`.
pub(crate) fn body_size(
    body: &Option<StreamingBlob>,
    declared: Option<i64>,
    largest: u64,
) -> S3Result<u64> {
    let declared = match (declared, body) {
        (Some(length), _) => length,
        (None, None) => 0,
        (None, Some(body)) => match body.remaining_length().exact() {
            Some(length) => length as i64,
            None => {
                return Err(s3(
                    S3ErrorCode::MissingContentLength,
                    "PutObject needs a Content-Length: the store learns an object's size \
                     before its bytes",
                ))
            }
        },
    };
    match u64::try_from(declared) {
        Ok(size) if size <= largest => Ok(size),
        _ => Err(s3(
            S3ErrorCode::EntityTooLarge,
            format!("this takes at most {largest} bytes, not {declared}"),
        )),
    }
}

/// The S3 error of a failed Put: BadDigest when the Content-MD5 refused
/// it, IncompleteBody when the body ended early or broke, else the
/// store's.
fn put_error(
    what: &str,
    size: u64,
    received: &Mutex<Received>,
    refused: Option<S3ErrorCode>,
    error: &Error,
) -> s3s::S3Error {
    if let Some(code) = refused {
        return s3(code, error.to_string());
    }
    let received = lock(received);
    if let Some(why) = &received.failed {
        return s3(
            S3ErrorCode::IncompleteBody,
            format!("{why}; nothing was stored"),
        );
    }
    // Short only if its end was read: a store that refused the Put before
    // reading all of it has its own error to tell.
    if received.ended && received.bytes < size && size > 0 {
        return s3(
            S3ErrorCode::IncompleteBody,
            format!(
                "the body held {} bytes, not the {size} of its Content-Length; nothing was stored",
                received.bytes
            ),
        );
    }
    from_store(&format!("storing {what}"), error)
}

/// The 16 bytes of a Content-MD5 header; InvalidDigest if it is not the
/// base64 of 16 bytes.
pub(crate) fn content_md5(header: Option<&str>) -> S3Result<Option<[u8; 16]>> {
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

/// Applies the conditional headers as S3 does: If-Match then
/// If-Unmodified-Since (412), If-None-Match then If-Modified-Since (304).
pub(crate) fn check_conditions(meta: &ObjectMeta, conditions: &Conditions) -> S3Result<()> {
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

/// The bytes a GetObject's Range (or its absence) asks of an object of
/// `meta`, with the Content-Range to answer for a Range.
fn range_span(
    range: Option<&Range>,
    meta: &ObjectMeta,
    bucket: &str,
    key: &str,
) -> S3Result<(std::ops::Range<u64>, Option<String>)> {
    let span = match range {
        Some(range) => range.check(meta.size).map_err(|_| {
            s3(
                S3ErrorCode::InvalidRange,
                format!(
                    "the range asked is outside '{bucket}/{key}', which holds {} bytes",
                    meta.size
                ),
            )
        })?,
        None => 0..meta.size,
    };
    if range.is_some() && span.is_empty() {
        // A suffix range of an empty object: no byte to send, and
        // `bytes 0-0/0` would claim one (RFC 9110, 14.1.2).
        return Err(s3(
            S3ErrorCode::InvalidRange,
            format!("'{bucket}/{key}' is empty: no range of it can be served"),
        ));
    }
    let content_range = range.map(|_| {
        format!(
            "bytes {}-{}/{}",
            span.start,
            span.end.saturating_sub(1),
            meta.size
        )
    });
    Ok((span, content_range))
}
