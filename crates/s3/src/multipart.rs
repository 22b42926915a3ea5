//! Multipart uploads. An upload is a small store object holding its
//! key's future metadata ([`crate::names::upload_name`]); each part is a
//! store object of its own ([`crate::names::part_name`]) with its MD5 in
//! its attributes. CompleteMultipartUpload moves no data: it writes at
//! `B/K` a *manifest*, whose attributes mark it ([`Multipart`]) and
//! whose body lists the parts with their sizes, store versions and
//! MD5s; a Get of it streams the parts in order. Overwriting or deleting
//! the key deletes the parts once the manifest is gone; anything a
//! gateway that died in between left behind is found by
//! [`Gateway::clean_uploads`].

use crate::buckets::now_ms;
use crate::copies::check_copy_conditions;
use crate::errors::{from_store, is_missing, s3};
use crate::names::{
    all_parts_prefix, hex, parse_part_name, part_name, parts_prefix, reserved_prefix, upload_name,
    Multipart, ObjectMeta,
};
use crate::objects::{
    check_fits, content_md5, meta_of, name_of, store_body, Claims, Conditions, LOOKUP_ATTEMPTS,
};
use crate::part_number::{check_part_number, MAX_PART_NUMBER};
use crate::parts::{
    delete_quietly, discard_upload, drop_parts, parts_use, previous_upload, start_object_read,
    Manifest, PartRef, Use, STORE_PAGE,
};
use crate::posts::{post, Target};
use crate::streams::{response_body, Piece};
use crate::uploads::UploadsQuery;
use crate::Gateway;
use md5::{Digest, Md5};
use s3s::dto::{Checksum, StreamingBlob};
use s3s::{S3ErrorCode, S3Result};
use std::collections::{BTreeMap, HashSet};
use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;
use strata_store_client::client::Client;

/// The smallest part but the last, as in S3.
pub const MIN_PART: u64 = 5 << 20;
/// The largest part, as in S3.
pub const MAX_PART: u64 = 5 << 30;
/// The largest multipart object, as in S3: 5 TiB.
pub const MAX_MULTIPART_OBJECT: u64 = 5 << 40;
/// Most parts or uploads one listing page returns, as in S3.
pub const MAX_LISTED: usize = 1000;
/// A part as the store lists it.
pub(crate) struct StoredPart {
    /// Its part number.
    pub number: u32,
    /// Its size in bytes.
    pub size: u64,
    /// Its store version.
    pub version: u64,
    /// Its metadata (the MD5 as ETag, when it was stored).
    pub meta: ObjectMeta,
}

/// A part of an UploadPart or UploadPartCopy.
pub(crate) struct PartTarget {
    /// The bucket.
    pub bucket: String,
    /// The key.
    pub key: String,
    /// The upload id.
    pub upload: String,
    /// The part number.
    pub number: i32,
}

/// The source of an UploadPartCopy.
pub(crate) struct CopySourceRef<'a> {
    /// Its bucket.
    pub bucket: &'a str,
    /// Its key.
    pub key: &'a str,
    /// `x-amz-copy-source-range`, if given.
    pub range: Option<&'a str>,
    /// The `x-amz-copy-source-if-*` headers.
    pub conditions: &'a Conditions,
}

/// The span `x-amz-copy-source-range` names in an object of `size`
/// bytes: `bytes=FIRST-LAST`, both inside it; the whole object without.
fn copy_range(range: Option<&str>, size: u64) -> S3Result<Range<u64>> {
    let Some(range) = range else {
        return Ok(0..size);
    };
    let bounds = range
        .strip_prefix("bytes=")
        .and_then(|span| span.split_once('-'))
        .and_then(|(first, last)| Some((first.parse::<u64>().ok()?, last.parse::<u64>().ok()?)));
    match bounds {
        Some((first, last)) if first <= last && last < size => Ok(first..last + 1),
        Some(_) => Err(s3(
            S3ErrorCode::InvalidRange,
            format!(
                "the copy source range {range:?} is outside the source, which holds {size} bytes"
            ),
        )),
        None => Err(s3(
            S3ErrorCode::InvalidArgument,
            format!("the copy source range {range:?} is not bytes=FIRST-LAST"),
        )),
    }
}

/// The S3 ETag of a multipart object of parts with MD5s `md5s` (hex):
/// the MD5 of their binary MD5s, then `-` and how many there are.
pub(crate) fn multipart_etag(md5s: &[&str]) -> String {
    let mut hasher = Md5::new();
    for md5 in md5s {
        hasher.update(unhex_md5(md5).unwrap_or_default());
    }
    let digest: [u8; 16] = hasher.finalize().into();
    format!("{}-{}", hex(&digest), md5s.len())
}

/// The 16 bytes of an MD5 in hex.
fn unhex_md5(text: &str) -> Option<[u8; 16]> {
    let mut bytes = [0u8; 16];
    if text.len() != 32 {
        return None;
    }
    for (at, byte) in bytes.iter_mut().enumerate() {
        *byte = u8::from_str_radix(text.get(2 * at..2 * at + 2)?, 16).ok()?;
    }
    Some(bytes)
}

fn no_such_upload(bucket: &str, key: &str, upload: &str) -> s3s::S3Error {
    s3(
        S3ErrorCode::NoSuchUpload,
        format!(
            "no multipart upload '{upload}' of '{bucket}/{key}' is in progress (it was \
             completed, aborted or expired, or never started): start one with \
             CreateMultipartUpload"
        ),
    )
}

/// A fresh upload id: 128 random bits in hex.
fn new_upload_id() -> S3Result<String> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).map_err(|e| {
        s3(
            S3ErrorCode::InternalError,
            format!("no random upload id: the system's random source failed: {e}"),
        )
    })?;
    Ok(hex(&bytes))
}

/// Whether `upload` could be an id this gateway gave (32 hex digits):
/// anything else names no upload, and never reaches a store name.
fn is_upload_id(upload: &str) -> bool {
    upload.len() == 32 && upload.bytes().all(|b| b.is_ascii_hexdigit())
}

impl Gateway {
    /// CreateMultipartUpload: stores the upload's state (the future
    /// object's content type and metadata, and the start time); returns
    /// the upload id.
    pub(crate) async fn create_upload(
        &self,
        client: &Client,
        bucket: &str,
        key: &str,
        content_type: Option<String>,
        metadata: BTreeMap<String, String>,
    ) -> S3Result<String> {
        self.bucket_exists(client, bucket).await?;
        name_of(bucket, key)?;
        let upload = new_upload_id()?;
        let state = ObjectMeta {
            etag: String::new(),
            size: 0,
            modified_ms: now_ms(),
            content_type,
            metadata,
            multipart: None,
        };
        // The manifest will carry this metadata and more: refuse now what
        // would not fit then.
        let largest = ObjectMeta {
            etag: format!("{}-{MAX_PART_NUMBER}", "0".repeat(32)),
            multipart: Some(Multipart {
                upload: upload.clone(),
                parts: MAX_PART_NUMBER,
                size: MAX_MULTIPART_OBJECT,
            }),
            ..state.clone()
        };
        check_fits(&largest, bucket, key)?;
        let attributes = state
            .attributes()
            .map_err(|why| s3(S3ErrorCode::MetadataTooLarge, why.to_string()))?;
        client
            .put_with_attributes(
                &upload_name(bucket, key, &upload),
                0,
                &mut &b""[..],
                &|_| {},
                || Ok(attributes),
            )
            .await
            .map_err(|e| from_store(&format!("starting an upload of '{bucket}/{key}'"), &e))?;
        Ok(upload)
    }

    /// The state of a pending upload: its metadata; NoSuchUpload (or
    /// NoSuchBucket) if there is none.
    pub(crate) async fn pending(
        &self,
        client: &Client,
        bucket: &str,
        key: &str,
        upload: &str,
    ) -> S3Result<ObjectMeta> {
        name_of(bucket, key)?;
        if !is_upload_id(upload) {
            self.bucket_exists(client, bucket).await?;
            return Err(no_such_upload(bucket, key, upload));
        }
        match client.stat(&upload_name(bucket, key, upload)).await {
            Ok(record) => Ok(ObjectMeta::from_record(0, record.crc, &record.attributes)),
            Err(e) if is_missing(&e) => {
                self.bucket_exists(client, bucket).await?;
                Err(no_such_upload(bucket, key, upload))
            }
            Err(e) => Err(from_store(
                &format!("looking up upload '{upload}' of '{bucket}/{key}'"),
                &e,
            )),
        }
    }

    /// UploadPart: the body stored as the part (replacing a part of that
    /// number), with its MD5 checked against Content-MD5 if given.
    pub(crate) async fn upload_part(
        &self,
        client: &Client,
        target: &PartTarget,
        body: Option<StreamingBlob>,
        content_length: Option<i64>,
        md5_header: Option<&str>,
        checksums: Checksum,
    ) -> S3Result<ObjectMeta> {
        let (bucket, key) = (target.bucket.as_str(), target.key.as_str());
        let number = check_part_number(target.number)?;
        self.pending(client, bucket, key, &target.upload).await?;
        let expected = content_md5(md5_header)?;
        let size = crate::objects::body_size(&body, content_length, MAX_PART)?;
        let name = part_name(bucket, key, &target.upload, number);
        let meta = part_meta(size);
        let what = format!("part {number} of '{bucket}/{key}'");
        let claims = Claims {
            md5: expected,
            checksums,
        };
        let stored_as = Target {
            name: &name,
            size,
            class: self.bucket_class(client, bucket).await?,
        };
        let meta = store_body(client, &stored_as, &what, body, claims, meta).await?;
        self.still_pending(client, bucket, key, &target.upload)
            .await?;
        Ok(meta)
    }

    /// After a part was stored: NoSuchUpload if its upload was completed
    /// or aborted meanwhile (an UploadPart that raced the Complete), as
    /// no object will hold that part. The part is left to the cleaner,
    /// which deletes only the parts an object's manifest does not list:
    /// deleting it here could take one a racing Complete listed.
    async fn still_pending(
        &self,
        client: &Client,
        bucket: &str,
        key: &str,
        upload: &str,
    ) -> S3Result<()> {
        match client.stat(&upload_name(bucket, key, upload)).await {
            Ok(_) => Ok(()),
            Err(e) if is_missing(&e) => Err(no_such_upload(bucket, key, upload)),
            Err(e) => Err(from_store(
                &format!("looking up upload '{upload}' of '{bucket}/{key}'"),
                &e,
            )),
        }
    }

    /// UploadPartCopy: the bytes of `range` (`bytes=FIRST-LAST`; the
    /// whole source without) of a source object stored as the part,
    /// streamed as a copy is.
    pub(crate) async fn upload_part_copy(
        &self,
        client: &Arc<Client>,
        target: &PartTarget,
        source: &CopySourceRef<'_>,
    ) -> S3Result<ObjectMeta> {
        let (bucket, key) = (target.bucket.as_str(), target.key.as_str());
        let number = check_part_number(target.number)?;
        self.pending(client, bucket, key, &target.upload).await?;
        let name = part_name(bucket, key, &target.upload, number);
        let what = format!("part {number} of '{bucket}/{key}'");
        let class = self.bucket_class(client, bucket).await?;
        for _ in 0..LOOKUP_ATTEMPTS {
            let opened = self.find(client, source.bucket, source.key).await?;
            let meta = meta_of(&opened);
            check_copy_conditions(&meta, source.conditions)?;
            let span = copy_range(source.range, meta.size)?;
            let size = span.end - span.start;
            if size > MAX_PART {
                return Err(s3(
                    S3ErrorCode::EntityTooLarge,
                    format!("a part holds at most {MAX_PART} bytes, not {size}"),
                ));
            }
            let version = opened.record.version;
            let (first, receiver) = start_object_read(
                client.clone(),
                source.bucket,
                source.key,
                opened,
                &meta,
                span,
            )
            .await;
            let body = match first {
                None => StreamingBlob::from(s3s::Body::from(bytes::Bytes::new())),
                Some(Piece::Data(first)) => response_body(first, receiver),
                Some(Piece::Failed(e)) => {
                    if self
                        .replaced(client, source.bucket, source.key, version)
                        .await
                    {
                        continue;
                    }
                    return Err(from_store(&format!("reading the source of {what}"), &e));
                }
            };
            let claims = Claims::default();
            let stored_as = Target {
                name: &name,
                size,
                class,
            };
            let meta = store_body(
                client,
                &stored_as,
                &what,
                Some(body),
                claims,
                part_meta(size),
            )
            .await?;
            self.still_pending(client, bucket, key, &target.upload)
                .await?;
            return Ok(meta);
        }
        Err(s3(
            S3ErrorCode::ServiceUnavailable,
            format!(
                "'{}/{}' was overwritten during every copy; retry",
                source.bucket, source.key
            ),
        ))
    }

    /// CompleteMultipartUpload: checks the parts listed (each uploaded,
    /// with that ETag, in ascending order, all but the last at least 5
    /// MiB), writes the manifest at the key, then forgets the upload and
    /// deletes the parts it left out and those of the object it replaced.
    pub(crate) async fn complete_upload(
        &self,
        client: &Client,
        bucket: &str,
        key: &str,
        upload: &str,
        listed: &[(i32, Option<String>)],
    ) -> S3Result<ObjectMeta> {
        let state = self.pending(client, bucket, key, upload).await?;
        let stored = self.stored_parts(client, bucket, key, upload).await?;
        let chosen = choose_parts(bucket, key, listed, &stored)?;
        let used: HashSet<u32> = chosen.iter().map(|part| part.number).collect();
        let (meta, body, attributes) = manifest(state, upload, chosen)?;
        let name = name_of(bucket, key)?;
        let previous = previous_upload(client, &name).await;
        let target = Target {
            name: &name,
            size: body.len() as u64,
            class: self.bucket_class(client, bucket).await?,
        };
        let mut data = std::io::Cursor::new(&body[..]);
        post(client, &target, &mut data, || Ok(attributes.clone()))
            .await
            .map_err(|e| from_store(&format!("completing '{bucket}/{key}'"), &e))?;
        // The manifest is in place: from here on, a failure leaves names
        // for the cleaner, never a broken object.
        delete_quietly(client, &upload_name(bucket, key, upload)).await;
        for part in stored.iter().filter(|part| !used.contains(&part.number)) {
            delete_quietly(client, &part_name(bucket, key, upload, part.number)).await;
        }
        if let Some(previous) = previous.filter(|previous| previous != upload) {
            drop_parts(client, bucket, key, &previous).await;
        }
        Ok(meta)
    }

    /// AbortMultipartUpload: forgets the upload, then deletes its parts
    /// ([`discard_upload`]).
    pub(crate) async fn abort_upload(
        &self,
        client: &Client,
        bucket: &str,
        key: &str,
        upload: &str,
    ) -> S3Result<()> {
        self.pending(client, bucket, key, upload).await?;
        discard_upload(client, bucket, key, upload).await;
        Ok(())
    }

    /// The parts of an upload, in part-number order.
    async fn stored_parts(
        &self,
        client: &Client,
        bucket: &str,
        key: &str,
        upload: &str,
    ) -> S3Result<Vec<StoredPart>> {
        self.list_parts(client, bucket, key, upload, 0, MAX_PART_NUMBER as usize)
            .await
    }

    /// ListParts: up to `max` parts after part number `after`.
    pub(crate) async fn list_parts(
        &self,
        client: &Client,
        bucket: &str,
        key: &str,
        upload: &str,
        after: u32,
        max: usize,
    ) -> S3Result<Vec<StoredPart>> {
        self.pending(client, bucket, key, upload).await?;
        let prefix = parts_prefix(bucket, key, upload);
        let mut cursor = if after > 0 {
            part_name(bucket, key, upload, after)
        } else {
            String::new()
        };
        let mut parts = Vec::new();
        while parts.len() < max {
            let (entries, next) = client
                .list(&prefix, &cursor, STORE_PAGE)
                .await
                .map_err(|e| from_store(&format!("listing the parts of upload '{upload}'"), &e))?;
            for entry in entries {
                let Some((_, _, number)) = parse_part_name(bucket, &entry.name) else {
                    continue;
                };
                if number > after && parts.len() < max {
                    parts.push(StoredPart {
                        number,
                        size: entry.size,
                        version: entry.version,
                        meta: ObjectMeta::from_record(entry.size, entry.crc, &entry.attributes),
                    });
                }
            }
            match next {
                Some(next) => cursor = cursor.max(next),
                None => break,
            }
        }
        Ok(parts)
    }

    /// Aborts the uploads of every bucket that started more than `expiry`
    /// ago, and deletes the parts no upload or object uses (those a
    /// gateway that died midway left); runs as the admin tenant.
    pub async fn clean_uploads(&self, admin: &Client, expiry: Duration) -> S3Result<usize> {
        let mut cleaned = 0;
        for bucket in self.list_buckets(admin).await? {
            cleaned += self.clean_bucket(admin, &bucket.name, expiry).await?;
        }
        Ok(cleaned)
    }

    /// [`Gateway::clean_uploads`] of one bucket; how many uploads (expired
    /// or left over) it removed.
    async fn clean_bucket(
        &self,
        admin: &Client,
        bucket: &str,
        expiry: Duration,
    ) -> S3Result<usize> {
        let oldest = now_ms().saturating_sub(expiry.as_millis() as u64);
        let mut cleaned = 0;
        let mut after: Option<(String, String)> = None;
        loop {
            let (key_marker, upload_marker) = match &after {
                Some((key, upload)) => (Some(key.as_str()), Some(upload.as_str())),
                None => (None, None),
            };
            let query = UploadsQuery {
                prefix: "",
                delimiter: None,
                key_marker,
                upload_marker,
                max: MAX_LISTED,
            };
            let page = self.list_uploads(admin, bucket, &query).await?;
            let mut last = None;
            for (key, upload, started) in page.uploads() {
                if started < oldest {
                    discard_upload(admin, bucket, key, upload).await;
                    cleaned += 1;
                }
                last = Some((key.to_string(), upload.to_string()));
            }
            after = last;
            if !page.truncated {
                break;
            }
        }
        // Parts by upload: one List per upload, skipping to the next.
        let prefix = all_parts_prefix(bucket);
        let mut cursor = String::new();
        loop {
            let (entries, _) = admin
                .list(&prefix, &cursor, 1)
                .await
                .map_err(|e| from_store(&format!("listing the parts in '{bucket}'"), &e))?;
            let Some(entry) = entries.into_iter().next() else {
                return Ok(cleaned);
            };
            let Some((key, upload, _)) = parse_part_name(bucket, &entry.name) else {
                // Not a name this gateway writes: step over it.
                cursor = entry.name;
                continue;
            };
            cursor = format!("{}\u{10FFFF}", parts_prefix(bucket, &key, &upload));
            match parts_use(admin, bucket, &key, &upload).await {
                Use::Pending | Use::Unknown => {}
                Use::Unused => {
                    drop_parts(admin, bucket, &key, &upload).await;
                    cleaned += 1;
                }
                Use::Object(count) => {
                    // More part names than the object has: a Complete
                    // stopped before deleting the parts it left out.
                    let prefix = parts_prefix(bucket, &key, &upload);
                    let listed = admin.list(&prefix, "", count + 1).await;
                    if listed.is_ok_and(|(names, _)| names.len() > count as usize) {
                        discard_upload(admin, bucket, &key, &upload).await;
                    }
                }
            }
        }
    }

    /// Deletes every name a bucket keeps for multipart uploads (before the
    /// bucket itself goes).
    pub(crate) async fn drop_reserved(&self, client: &Client, bucket: &str) -> S3Result<()> {
        let prefix = reserved_prefix(bucket);
        loop {
            let (entries, _) = client
                .list(&prefix, "", STORE_PAGE)
                .await
                .map_err(|e| from_store(&format!("listing uploads of '{bucket}'"), &e))?;
            if entries.is_empty() {
                return Ok(());
            }
            for entry in entries {
                match client.delete(&entry.name).await {
                    Ok(_) => {}
                    Err(e) if is_missing(&e) => {}
                    Err(e) => return Err(from_store(&format!("deleting '{}'", entry.name), &e)),
                }
            }
        }
    }
}

/// The parts a Complete names, checked against those stored: the
/// manifest's entries, in order.
fn choose_parts(
    bucket: &str,
    key: &str,
    listed: &[(i32, Option<String>)],
    stored: &[StoredPart],
) -> S3Result<Vec<PartRef>> {
    if listed.is_empty() {
        return Err(s3(
            S3ErrorCode::MalformedXML,
            "CompleteMultipartUpload lists no part: name at least one",
        ));
    }
    let mut previous = 0;
    for (number, _) in listed {
        let number = check_part_number(*number)?;
        if number <= previous {
            return Err(s3(
                S3ErrorCode::InvalidPartOrder,
                format!(
                    "part {number} follows part {previous}: list parts in ascending order, \
                     each once"
                ),
            ));
        }
        previous = number;
    }
    let mut chosen: Vec<PartRef> = Vec::with_capacity(listed.len());
    for (number, etag) in listed {
        let number = check_part_number(*number)?;
        // Both lists are in part-number order: a binary search each.
        let found = stored
            .binary_search_by_key(&number, |part| part.number)
            .ok()
            .map(|at| &stored[at]);
        let Some(part) = found.filter(|part| {
            etag.as_deref()
                .is_none_or(|etag| etag.trim_matches('"') == part.meta.etag)
        }) else {
            return Err(s3(
                S3ErrorCode::InvalidPart,
                format!(
                    "part {number} of '{bucket}/{key}' was not uploaded, or not with the ETag \
                     given: upload it, or list the ETag UploadPart answered"
                ),
            ));
        };
        chosen.push(PartRef {
            number,
            size: part.size,
            version: part.version,
            etag: part.meta.etag.clone(),
        });
    }
    let last = chosen.len() - 1;
    if let Some(part) = chosen[..last].iter().find(|part| part.size < MIN_PART) {
        return Err(s3(
            S3ErrorCode::EntityTooSmall,
            format!(
                "part {} holds {} bytes: every part but the last must hold at least \
                 {MIN_PART} (5 MiB)",
                part.number, part.size
            ),
        ));
    }
    Ok(chosen)
}

/// The manifest of `upload` of the parts `chosen`, for an object with
/// the pending upload's metadata `state`: its metadata, body and record
/// attributes.
fn manifest(
    state: ObjectMeta,
    upload: &str,
    chosen: Vec<PartRef>,
) -> S3Result<(ObjectMeta, Vec<u8>, Vec<u8>)> {
    let size: u64 = chosen.iter().map(|part| part.size).sum();
    if size > MAX_MULTIPART_OBJECT {
        return Err(s3(
            S3ErrorCode::EntityTooLarge,
            format!("the parts hold {size} bytes; an object holds at most {MAX_MULTIPART_OBJECT}"),
        ));
    }
    let md5s: Vec<&str> = chosen.iter().map(|part| part.etag.as_str()).collect();
    let meta = ObjectMeta {
        etag: multipart_etag(&md5s),
        size,
        modified_ms: now_ms(),
        multipart: Some(Multipart {
            upload: upload.to_string(),
            parts: chosen.len() as u32,
            size,
        }),
        ..state
    };
    let body = serde_json::to_vec(&Manifest { parts: chosen }).map_err(|e| {
        s3(
            S3ErrorCode::InternalError,
            format!("encoding a manifest: {e}"),
        )
    })?;
    let attributes = meta
        .attributes()
        .map_err(|why| s3(S3ErrorCode::MetadataTooLarge, why.to_string()))?;
    Ok((meta, body, attributes))
}

/// The metadata a part's record carries (its MD5 is filled in as it is
/// stored).
fn part_meta(size: u64) -> ObjectMeta {
    ObjectMeta {
        etag: "0".repeat(32),
        size,
        modified_ms: now_ms(),
        content_type: None,
        metadata: BTreeMap::new(),
        multipart: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored(number: u32, size: u64, etag: &str) -> StoredPart {
        StoredPart {
            number,
            size,
            version: 7,
            meta: ObjectMeta {
                etag: etag.into(),
                ..part_meta(size)
            },
        }
    }

    #[test]
    fn the_multipart_etag_is_s3s() {
        // Two parts whose MD5s are those of "a" and "b": S3 gives the MD5
        // of the 32 bytes of both digests, then "-2".
        let a = "0cc175b9c0f1b6a831c399e269772661";
        let b = "92eb5ffee6ae2fec3ad71c777531578f";
        let mut both = unhex_md5(a).unwrap().to_vec();
        both.extend(unhex_md5(b).unwrap());
        let expected = format!("{}-2", hex(&Md5::digest(&both)));
        assert_eq!(multipart_etag(&[a, b]), expected);
    }

    #[test]
    fn a_copy_range_is_inside_the_source() {
        assert_eq!(copy_range(None, 10).unwrap(), 0..10);
        assert_eq!(copy_range(Some("bytes=2-5"), 10).unwrap(), 2..6);
        assert_eq!(copy_range(Some("bytes=0-9"), 10).unwrap(), 0..10);
        let code = |range| {
            copy_range(Some(range), 10)
                .unwrap_err()
                .code()
                .as_str()
                .to_string()
        };
        assert_eq!(code("bytes=5-10"), "InvalidRange");
        assert_eq!(code("bytes=6-5"), "InvalidRange");
        assert_eq!(code("bytes=-5"), "InvalidArgument");
        assert_eq!(code("5-6"), "InvalidArgument");
    }

    #[test]
    fn a_complete_checks_order_presence_etags_and_sizes() {
        let md5 = "0cc175b9c0f1b6a831c399e269772661";
        let parts = [
            stored(1, MIN_PART, md5),
            stored(2, 10, md5),
            stored(3, 1, md5),
        ];
        let ok = choose_parts(
            "b",
            "k",
            &[(1, Some(format!("\"{md5}\""))), (3, None)],
            &parts,
        );
        assert_eq!(ok.unwrap().len(), 2);
        let code = |listed: &[(i32, Option<String>)]| {
            choose_parts("b", "k", listed, &parts)
                .err()
                .map(|e| e.code().as_str().to_string())
        };
        assert_eq!(code(&[]).as_deref(), Some("MalformedXML"));
        assert_eq!(
            code(&[(2, None), (1, None)]).as_deref(),
            Some("InvalidPartOrder")
        );
        assert_eq!(
            code(&[(1, None), (1, None)]).as_deref(),
            Some("InvalidPartOrder")
        );
        assert_eq!(code(&[(4, None)]).as_deref(), Some("InvalidPart"));
        assert_eq!(
            code(&[(1, Some("0".repeat(32)))]).as_deref(),
            Some("InvalidPart")
        );
        assert_eq!(
            code(&[(2, None), (3, None)]).as_deref(),
            Some("EntityTooSmall")
        );
        assert_eq!(code(&[(0, None)]).as_deref(), Some("InvalidArgument"));
        assert_eq!(code(&[(10_001, None)]).as_deref(), Some("InvalidArgument"));
    }
}
