//! CompleteMultipartUpload. It moves no data: it picks, for each part
//! number the request lists, the stored attempt with the ETag listed
//! (every UploadPart stores under a name of its own,
//! [`crate::names::part_name`]), checks the part rules and checksums,
//! and writes at `B/K` a *manifest* naming exactly those attempts. Then
//! it forgets the upload and deletes every other attempt, listed after
//! the upload was forgotten, so that a part stored meanwhile is either
//! deleted here or by its own UploadPart ([`Gateway::upload_part`]).

use crate::buckets::now_ms;
use crate::checksums::{combined_crc, composite, Algorithm, KeptChecksum};
use crate::errors::{from_store, s3};
use crate::multipart::{StoredPart, MAX_MULTIPART_OBJECT, MIN_PART};
use crate::names::{hex, upload_name, Multipart, ObjectMeta};
use crate::objects::name_of;
use crate::part_number::{check_part_number, MAX_PART_NUMBER};
use crate::parts::{
    delete_quietly, drop_parts, drop_parts_but, previous_upload, Manifest, PartRef,
};
use crate::posts::{post, Target};
use crate::Gateway;
use md5::{Digest, Md5};
use s3s::dto::Checksum;
use s3s::{S3ErrorCode, S3Result};
use std::collections::HashSet;
use strata_store_client::client::Client;

/// A part as a CompleteMultipartUpload lists it.
pub(crate) struct ListedPart {
    /// Its part number (checked here: s3s passes any integer).
    pub number: i32,
    /// The ETag listed, if any.
    pub etag: Option<String>,
    /// The `Checksum*` values listed (base64).
    pub checksums: Checksum,
}

impl Gateway {
    /// CompleteMultipartUpload: checks the parts listed (each uploaded,
    /// with that ETag and checksum, in ascending order, all but the last
    /// at least 5 MiB), writes the manifest at the key, then forgets the
    /// upload and deletes the attempts it left out and the parts of the
    /// object it replaced.
    pub(crate) async fn complete_upload(
        &self,
        client: &Client,
        (bucket, key): (&str, &str),
        upload: &str,
        listed: &[ListedPart],
        claimed: &Checksum,
    ) -> S3Result<ObjectMeta> {
        let state = self.pending(client, bucket, key, upload).await?;
        let stored = self
            .stored_attempts(client, (bucket, key), upload, 0, MAX_PART_NUMBER as usize)
            .await?;
        let chosen = choose_parts(bucket, key, listed, &stored)?;
        let kept: HashSet<String> = chosen
            .iter()
            .map(|part| part.store_name(bucket, key, upload))
            .collect();
        let (meta, body, attributes) = manifest(state, upload, chosen)?;
        check_claimed_whole(meta.checksum.as_ref(), claimed)?;
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
        // for the cleaner, never a broken object. The attempts are listed
        // once the upload is forgotten: an UploadPart that found it still
        // pending stored its part before, and this listing sees it.
        delete_quietly(client, &upload_name(bucket, key, upload)).await;
        drop_parts_but(client, bucket, key, upload, &kept).await;
        if let Some(previous) = previous.filter(|previous| previous != upload) {
            drop_parts(client, bucket, key, &previous).await;
        }
        Ok(meta)
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

/// The part numbers listed, checked: each allowed, in ascending order,
/// at least one.
fn check_order(listed: &[ListedPart]) -> S3Result<Vec<u32>> {
    if listed.is_empty() {
        return Err(s3(
            S3ErrorCode::MalformedXML,
            "CompleteMultipartUpload lists no part: name at least one",
        ));
    }
    let mut numbers = Vec::with_capacity(listed.len());
    let mut previous = 0;
    for part in listed {
        let number = check_part_number(part.number)?;
        if number <= previous {
            return Err(s3(
                S3ErrorCode::InvalidPartOrder,
                format!(
                    "part {number} follows part {previous}: list parts in ascending order, \
                     each once"
                ),
            ));
        }
        numbers.push(number);
        previous = number;
    }
    Ok(numbers)
}

/// The attempt of part `number` a Complete names: among those stored
/// (`stored`, in name order: by number, then attempt), the latest with
/// the ETag listed, or the latest if none is listed.
fn pick<'a>(stored: &'a [StoredPart], number: u32, etag: Option<&str>) -> Option<&'a StoredPart> {
    let start = stored.partition_point(|part| part.number < number);
    let end = stored.partition_point(|part| part.number <= number);
    stored[start..end]
        .iter()
        .rev()
        .find(|part| etag.is_none_or(|etag| etag.trim_matches('"') == part.meta.etag))
}

/// Refuses a part whose checksum differs from one the Complete lists.
fn check_listed_checksums(number: u32, part: &StoredPart, listed: &Checksum) -> S3Result<()> {
    for algorithm in Algorithm::ALL {
        let Some(value) = algorithm.of(listed) else {
            continue;
        };
        let kept = part.meta.checksum.as_ref();
        if kept.is_none_or(|kept| kept.algorithm != algorithm || &kept.value != value) {
            return Err(s3(
                S3ErrorCode::InvalidPart,
                format!(
                    "part {number} was not uploaded with the {} {value} listed: list the \
                     checksum UploadPart answered",
                    algorithm.name()
                ),
            ));
        }
    }
    Ok(())
}

/// The parts a Complete names, checked against the attempts stored: the
/// manifest's entries, in order.
fn choose_parts(
    bucket: &str,
    key: &str,
    listed: &[ListedPart],
    stored: &[StoredPart],
) -> S3Result<Vec<PartRef>> {
    let numbers = check_order(listed)?;
    let mut chosen: Vec<PartRef> = Vec::with_capacity(listed.len());
    for (number, part) in numbers.into_iter().zip(listed) {
        let Some(found) = pick(stored, number, part.etag.as_deref()) else {
            return Err(s3(
                S3ErrorCode::InvalidPart,
                format!(
                    "part {number} of '{bucket}/{key}' was not uploaded, or not with the ETag \
                     given: upload it, or list the ETag UploadPart answered"
                ),
            ));
        };
        check_listed_checksums(number, found, &part.checksums)?;
        chosen.push(PartRef {
            number,
            size: found.size,
            version: found.version,
            etag: found.meta.etag.clone(),
            attempt: found.attempt.clone(),
            checksum: found.meta.checksum.as_ref().map(|kept| kept.value.clone()),
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

/// A Complete listing a part kept without the upload's checksum.
fn part_without_checksum(algorithm: Algorithm) -> s3s::S3Error {
    s3(
        S3ErrorCode::InvalidPart,
        format!(
            "a part listed has no {} checksum, which this upload was started with: \
             upload it again",
            algorithm.name()
        ),
    )
}

/// The composite checksum of `chosen` in the upload's `algorithm`:
/// every part was stored with a checksum of it (UploadPart computes it).
fn composite_checksum(algorithm: Algorithm, chosen: &[PartRef]) -> S3Result<KeptChecksum> {
    let values: Option<Vec<&str>> = chosen.iter().map(|part| part.checksum.as_deref()).collect();
    let value = values.and_then(|values| composite(algorithm, &values));
    let Some(value) = value else {
        return Err(part_without_checksum(algorithm));
    };
    Ok(KeptChecksum {
        algorithm,
        value,
        full_object: false,
    })
}

/// The whole object's CRC of `chosen` in the upload's `algorithm`, for
/// an upload of checksum type `FULL_OBJECT`: combined from the parts'.
fn full_object_checksum(algorithm: Algorithm, chosen: &[PartRef]) -> S3Result<KeptChecksum> {
    let listed: Option<Vec<(&str, u64)>> = chosen
        .iter()
        .map(|part| Some((part.checksum.as_deref()?, part.size)))
        .collect();
    let Some(value) = listed.and_then(|listed| combined_crc(algorithm, &listed)) else {
        return Err(part_without_checksum(algorithm));
    };
    Ok(KeptChecksum {
        algorithm,
        value,
        full_object: true,
    })
}

/// Refuses a Complete whose own full-object checksum (`claimed`, its
/// `x-amz-checksum-*` header) differs from the one the parts make.
pub(crate) fn check_claimed_whole(kept: Option<&KeptChecksum>, claimed: &Checksum) -> S3Result<()> {
    for algorithm in Algorithm::ALL {
        let Some(value) = algorithm.of(claimed) else {
            continue;
        };
        let matches = kept.is_some_and(|kept| {
            kept.algorithm == algorithm && kept.full_object && &kept.value == value
        });
        if !matches {
            return Err(s3(
                S3ErrorCode::BadDigest,
                format!(
                    "the Complete's {} checksum {value} is not the object's: {}",
                    algorithm.name(),
                    match kept {
                        Some(kept) if kept.full_object && kept.algorithm == algorithm => {
                            format!("its parts make {}", kept.value)
                        }
                        _ => "send a whole-object checksum only for an upload created with \
                              that algorithm and checksum type FULL_OBJECT"
                            .to_string(),
                    }
                ),
            ));
        }
    }
    Ok(())
}

/// The manifest of `upload` of the parts `chosen`, for an object with
/// the pending upload's metadata `state` (and its checksum algorithm):
/// its metadata, body and record attributes.
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
    let checksum = match &state.checksum {
        Some(kept) if kept.full_object => Some(full_object_checksum(kept.algorithm, &chosen)?),
        Some(kept) => Some(composite_checksum(kept.algorithm, &chosen)?),
        None => None,
    };
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
        checksum,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::multipart::part_meta;

    fn stored(number: u32, attempt: &str, size: u64, etag: &str) -> StoredPart {
        StoredPart {
            number,
            attempt: Some(attempt.into()),
            size,
            version: 7,
            meta: ObjectMeta {
                etag: etag.into(),
                checksum: Some(KeptChecksum {
                    algorithm: Algorithm::Crc32c,
                    value: Algorithm::Crc32c.digest(etag.as_bytes()),
                    full_object: false,
                }),
                ..part_meta(size)
            },
        }
    }

    fn listed(number: i32, etag: Option<&str>) -> ListedPart {
        ListedPart {
            number,
            etag: etag.map(|etag| format!("\"{etag}\"")),
            checksums: Checksum::default(),
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
    fn a_complete_checks_order_presence_etags_and_sizes() {
        let md5 = "0cc175b9c0f1b6a831c399e269772661";
        let parts = [
            stored(1, "01", MIN_PART, md5),
            stored(2, "01", 10, md5),
            stored(3, "01", 1, md5),
        ];
        let ok = choose_parts("b", "k", &[listed(1, Some(md5)), listed(3, None)], &parts);
        assert_eq!(ok.unwrap().len(), 2);
        let code = |listed: &[ListedPart]| {
            choose_parts("b", "k", listed, &parts)
                .err()
                .map(|e| e.code().as_str().to_string())
        };
        assert_eq!(code(&[]).as_deref(), Some("MalformedXML"));
        let order = Some("InvalidPartOrder");
        assert_eq!(code(&[listed(2, None), listed(1, None)]).as_deref(), order);
        assert_eq!(code(&[listed(1, None), listed(1, None)]).as_deref(), order);
        assert_eq!(code(&[listed(4, None)]).as_deref(), Some("InvalidPart"));
        let zeros = "0".repeat(32);
        assert_eq!(
            code(&[listed(1, Some(&zeros))]).as_deref(),
            Some("InvalidPart")
        );
        let small = [listed(2, None), listed(3, None)];
        assert_eq!(code(&small).as_deref(), Some("EntityTooSmall"));
        assert_eq!(code(&[listed(0, None)]).as_deref(), Some("InvalidArgument"));
        assert_eq!(
            code(&[listed(10_001, None)]).as_deref(),
            Some("InvalidArgument")
        );
    }

    #[test]
    fn a_complete_takes_the_attempt_with_the_etag_listed() {
        let (old, new) = ("a".repeat(32), "b".repeat(32));
        // Part 1 uploaded twice (attempts 01 and 02), part 2 once.
        let parts = [
            stored(1, "01", MIN_PART, &old),
            stored(1, "02", MIN_PART, &new),
            stored(2, "01", 5, &old),
        ];
        let attempt = |etag: Option<&str>| {
            let chosen = choose_parts("b", "k", &[listed(1, etag), listed(2, None)], &parts);
            chosen.unwrap()[0].attempt.clone().unwrap()
        };
        assert_eq!(attempt(Some(&old)), "01");
        assert_eq!(attempt(Some(&new)), "02");
        assert_eq!(attempt(None), "02", "the latest without an ETag");
    }

    #[test]
    fn a_complete_checks_the_checksums_listed_and_answers_the_composite() {
        let md5 = "c".repeat(32);
        let parts = [stored(1, "01", MIN_PART, &md5), stored(2, "01", 3, &md5)];
        let kept = Algorithm::Crc32c.digest(md5.as_bytes());
        let with = |algorithm: Algorithm, value: &str| {
            let mut part = listed(1, Some(&md5));
            algorithm.set(&mut part.checksums, value.to_string());
            choose_parts("b", "k", &[part, listed(2, None)], &parts)
        };
        let chosen = with(Algorithm::Crc32c, &kept).unwrap();
        let wrong = Algorithm::Crc32c.digest(b"other");
        let code = |result: S3Result<Vec<PartRef>>| result.err().map(|e| e.code().clone());
        assert_eq!(
            code(with(Algorithm::Crc32c, &wrong)),
            Some(S3ErrorCode::InvalidPart)
        );
        assert_eq!(
            code(with(Algorithm::Sha1, &kept)),
            Some(S3ErrorCode::InvalidPart)
        );
        let state = ObjectMeta {
            checksum: Some(KeptChecksum {
                algorithm: Algorithm::Crc32c,
                value: String::new(),
                full_object: false,
            }),
            ..part_meta(0)
        };
        let (meta, _, _) = manifest(state, "u", chosen).unwrap();
        let expected = composite(Algorithm::Crc32c, &[&kept, &kept]).unwrap();
        assert_eq!(meta.checksum.unwrap().value, expected);
        assert!(expected.ends_with("-2"));
    }
}
