//! Multipart uploads. An upload is a small store object holding its
//! key's future metadata ([`crate::names::upload_name`]); each
//! UploadPart stores a store object of its own, under a name unique to
//! that attempt ([`crate::names::part_name`]), with its MD5 and checksum
//! in its attributes. CompleteMultipartUpload ([`crate::complete`])
//! moves no data: it writes at `B/K` a *manifest*, whose attributes mark
//! it ([`Multipart`]) and whose body names the attempts it took with
//! their sizes, store versions and MD5s; a Get of it streams the parts
//! in order. Overwriting or deleting the key deletes the parts once the
//! manifest is gone; anything a gateway that died in between left
//! behind is found by [`Gateway::clean_uploads`].

use crate::buckets::now_ms;
use crate::checksums::{Algorithm, ChecksumRequest, KeptChecksum};
use crate::copies::check_copy_conditions;
use crate::errors::{from_store, is_missing, s3};
use crate::names::{
    all_parts_prefix, hex, parse_part_name, part_name, parts_prefix, reserved_prefix, upload_name,
    Multipart, ObjectMeta, PartName,
};
use crate::objects::{
    check_fits, content_md5, meta_of, name_of, store_body, Claims, Conditions, LOOKUP_ATTEMPTS,
};
use crate::part_number::{check_part_number, MAX_PART_NUMBER};
use crate::parts::{
    delete_quietly, discard_upload, drop_parts, manifest_parts, parts_use, start_object_read, Use,
    STORE_PAGE,
};
use crate::posts::Target;
use crate::streams::{response_body, Piece};
use crate::uploads::UploadsQuery;
use crate::Gateway;
use s3s::dto::StreamingBlob;
use s3s::{S3ErrorCode, S3Result};
use std::collections::BTreeMap;
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
/// Most attempts of one part number an upload keeps: every UploadPart
/// stores under a name of its own, and the attempts a Complete does not
/// name are deleted only then (or at the Abort, or the expiry), so a
/// client re-uploading one part without end is refused past this.
pub const MAX_ATTEMPTS: usize = 16;

/// One attempt at a part, as the store lists it.
pub(crate) struct StoredPart {
    /// Its part number.
    pub number: u32,
    /// The id of the UploadPart that stored it (`None`: an older
    /// gateway's part).
    pub attempt: Option<String>,
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
    random_hex::<16>("upload id")
}

/// `N` random bytes in hex, for a fresh `what`.
fn random_hex<const N: usize>(what: &str) -> S3Result<String> {
    let mut bytes = [0u8; N];
    getrandom::fill(&mut bytes).map_err(|e| {
        s3(
            S3ErrorCode::InternalError,
            format!("no random {what}: the system's random source failed: {e}"),
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
    /// object's content type and metadata, its checksum algorithm, and
    /// the start time); returns the upload id.
    pub(crate) async fn create_upload(
        &self,
        client: &Client,
        (bucket, key): (&str, &str),
        content_type: Option<String>,
        metadata: BTreeMap<String, String>,
        algorithm: Option<Algorithm>,
        full_object: bool,
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
            // The algorithm, with no value yet: every part is kept with
            // it, and the Complete answers their composite, or the whole
            // object's CRC combined from theirs.
            checksum: algorithm.map(|algorithm| KeptChecksum {
                algorithm,
                value: String::new(),
                full_object,
            }),
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
            checksum: algorithm
                .map(|algorithm| KeptChecksum::placeholder(algorithm, MAX_PART_NUMBER)),
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

    /// UploadPart: the body stored as a new attempt at the part, under a
    /// name of its own ([`part_name`]), with its MD5 checked against
    /// Content-MD5 and its checksums against those claimed; the upload's
    /// checksum algorithm, if it has one, is computed and kept with it.
    pub(crate) async fn upload_part(
        &self,
        client: &Client,
        target: &PartTarget,
        body: Option<StreamingBlob>,
        (content_length, md5_header): (Option<i64>, Option<&str>),
        checksums: ChecksumRequest,
    ) -> S3Result<ObjectMeta> {
        let (bucket, key) = (target.bucket.as_str(), target.key.as_str());
        let number = check_part_number(target.number)?;
        let state = self.pending(client, bucket, key, &target.upload).await?;
        let expected = content_md5(md5_header)?;
        let size = crate::objects::body_size(&body, content_length, MAX_PART)?;
        let name = self.new_attempt(client, target, number).await?;
        let what = format!("part {number} of '{bucket}/{key}'");
        let claims = Claims {
            md5: expected,
            checksums: checksums.claims(state.checksum.map(|kept| kept.algorithm)),
        };
        let stored_as = Target {
            name: &name,
            size,
            class: self.bucket_class(client, bucket).await?,
        };
        let meta = store_body(client, &stored_as, &what, body, claims, part_meta(size)).await?;
        self.settle_part(client, (bucket, key), &target.upload, &name)
            .await?;
        Ok(meta)
    }

    /// The store name of a new attempt at part `number` of `target`'s
    /// upload: its id is the clock in microseconds then 32 random bits,
    /// so attempts sort in the order they started and never share a
    /// name. Refused once the number has [`MAX_ATTEMPTS`] attempts.
    async fn new_attempt(
        &self,
        client: &Client,
        target: &PartTarget,
        number: u32,
    ) -> S3Result<String> {
        let (bucket, key, upload) = (&target.bucket, &target.key, &target.upload);
        let prefix = part_name(bucket, key, upload, number, None);
        let limit = MAX_ATTEMPTS as u32 + 1;
        let (entries, _) = client
            .list(&prefix, "", limit)
            .await
            .map_err(|e| from_store(&format!("listing the parts of upload '{upload}'"), &e))?;
        if entries.len() >= MAX_ATTEMPTS {
            return Err(s3(
                S3ErrorCode::InvalidRequest,
                format!(
                    "part {number} of upload '{upload}' was uploaded {MAX_ATTEMPTS} times: \
                     complete or abort the upload, or start another"
                ),
            ));
        }
        let random = random_hex::<4>("part id")?;
        let micros = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |since| since.as_micros() as u64);
        let attempt = format!("{micros:016x}{random}");
        Ok(part_name(bucket, key, upload, number, Some(&attempt)))
    }

    /// After the part `name` was stored: if its upload is still pending,
    /// it is one of the upload's parts (a Complete that forgets the
    /// upload later lists it, and deletes it unless it names it). If the
    /// upload is gone (completed or aborted meanwhile), the part is
    /// deleted here, unless the Complete's manifest names it (it was
    /// stored before the Complete listed the parts), and the answer is
    /// NoSuchUpload. A store that cannot tell leaves it to the cleaner.
    async fn settle_part(
        &self,
        client: &Client,
        (bucket, key): (&str, &str),
        upload: &str,
        name: &str,
    ) -> S3Result<()> {
        match client.stat(&upload_name(bucket, key, upload)).await {
            Ok(_) => return Ok(()),
            Err(e) if is_missing(&e) => {}
            Err(e) => {
                return Err(from_store(
                    &format!("looking up upload '{upload}' of '{bucket}/{key}'"),
                    &e,
                ))
            }
        }
        match manifest_parts(client, bucket, key, upload).await {
            Ok(Some(used)) if used.contains(name) => Ok(()),
            Ok(_) => {
                delete_quietly(client, name).await;
                Err(no_such_upload(bucket, key, upload))
            }
            Err(_) => Err(no_such_upload(bucket, key, upload)),
        }
    }

    /// UploadPartCopy: the bytes of `range` (`bytes=FIRST-LAST`; the
    /// whole source without) of a source object stored as a new attempt
    /// at the part, streamed as a copy is (with the upload's checksum
    /// algorithm computed and kept, as for an UploadPart).
    pub(crate) async fn upload_part_copy(
        &self,
        client: &Arc<Client>,
        target: &PartTarget,
        source: &CopySourceRef<'_>,
    ) -> S3Result<ObjectMeta> {
        let (bucket, key) = (target.bucket.as_str(), target.key.as_str());
        let number = check_part_number(target.number)?;
        let state = self.pending(client, bucket, key, &target.upload).await?;
        let algorithm = state.checksum.map(|kept| kept.algorithm);
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
            let at = (source.bucket, source.key);
            let (first, receiver) =
                start_object_read(client.clone(), at.0, at.1, opened, &meta, span).await;
            let body = match first {
                None => StreamingBlob::from(s3s::Body::from(bytes::Bytes::new())),
                Some(Piece::Data(first)) => response_body(first, receiver),
                Some(Piece::Failed(e)) => {
                    if self.replaced(client, at.0, at.1, version).await {
                        continue;
                    }
                    return Err(from_store(&format!("reading the source of {what}"), &e));
                }
            };
            let claims = Claims {
                md5: None,
                checksums: ChecksumRequest::default().claims(algorithm),
            };
            let name = self.new_attempt(client, target, number).await?;
            let stored_as = Target {
                name: &name,
                size,
                class,
            };
            let body = Some(body);
            let meta = store_body(client, &stored_as, &what, body, claims, part_meta(size)).await?;
            self.settle_part(client, (bucket, key), &target.upload, &name)
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

    /// Every attempt at the parts of an upload numbered after `after`, in
    /// name order (by number, then attempt), for at most `max` part
    /// numbers: the attempts of the last number listed are all there.
    pub(crate) async fn stored_attempts(
        &self,
        client: &Client,
        (bucket, key): (&str, &str),
        upload: &str,
        after: u32,
        max: usize,
    ) -> S3Result<Vec<StoredPart>> {
        self.pending(client, bucket, key, upload).await?;
        let prefix = parts_prefix(bucket, key, upload);
        let mut cursor = String::new();
        if after > 0 {
            // Past every attempt at `after`: they follow its bare name.
            cursor = format!("{}.", part_name(bucket, key, upload, after, None));
        }
        let mut parts: Vec<StoredPart> = Vec::new();
        let mut numbers = 0;
        loop {
            let (entries, next) = client
                .list(&prefix, &cursor, STORE_PAGE)
                .await
                .map_err(|e| from_store(&format!("listing the parts of upload '{upload}'"), &e))?;
            for entry in entries {
                let Some(part) = parse_part_name(bucket, &entry.name) else {
                    continue;
                };
                if part.number <= after {
                    continue;
                }
                if parts.last().is_none_or(|last| last.number != part.number) {
                    numbers += 1;
                    if numbers > max {
                        return Ok(parts);
                    }
                }
                parts.push(StoredPart {
                    number: part.number,
                    attempt: part.attempt,
                    size: entry.size,
                    version: entry.version,
                    meta: ObjectMeta::from_record(entry.size, entry.crc, &entry.attributes),
                });
            }
            match next {
                Some(next) => cursor = cursor.max(next),
                None => return Ok(parts),
            }
        }
    }

    /// ListParts: the latest attempt at each of up to `max` part numbers
    /// after `after`.
    pub(crate) async fn list_parts(
        &self,
        client: &Client,
        (bucket, key): (&str, &str),
        upload: &str,
        after: u32,
        max: usize,
    ) -> S3Result<Vec<StoredPart>> {
        let attempts = self
            .stored_attempts(client, (bucket, key), upload, after, max)
            .await?;
        let mut latest: Vec<StoredPart> = Vec::with_capacity(attempts.len());
        for attempt in attempts {
            match latest.last_mut() {
                Some(last) if last.number == attempt.number => *last = attempt,
                _ => latest.push(attempt),
            }
        }
        Ok(latest)
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
            let Some(PartName { key, upload, .. }) = parse_part_name(bucket, &entry.name) else {
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

/// The metadata a part's record carries (its MD5 and checksum are
/// filled in as it is stored).
pub(crate) fn part_meta(size: u64) -> ObjectMeta {
    ObjectMeta {
        etag: "0".repeat(32),
        size,
        modified_ms: now_ms(),
        content_type: None,
        metadata: BTreeMap::new(),
        multipart: None,
        checksum: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
