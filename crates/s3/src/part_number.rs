//! `partNumber` on GetObject and HeadObject: the bytes of one part of a
//! completed multipart upload, as S3 serves them (a 206 with the part's
//! Content-Range, and the object's part count in `x-amz-mp-parts-count`).
//! An object stored in one piece has one part, number 1.

use crate::checksums::KeptChecksum;
use crate::errors::{from_store, s3};
use crate::names::ObjectMeta;
use crate::parts::read_manifest;
use s3s::{S3Error, S3ErrorCode, S3Result};
use std::ops::Range;
use strata_store_client::client::{Client, Opened};

/// The highest part number, as in S3.
pub const MAX_PART_NUMBER: u32 = 10_000;

/// One part of an object: where its bytes lie, and how many parts the
/// object has.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct PartSpan {
    /// The part's bytes, as offsets in the object.
    pub span: Range<u64>,
    /// The object's part count.
    pub parts: u32,
    /// The part's own checksum, in the object's algorithm (base64), if
    /// it has one: answered for the part's bytes with
    /// `x-amz-checksum-mode: ENABLED`.
    pub checksum: Option<KeptChecksum>,
}

impl PartSpan {
    /// The Content-Range of the part in an object of `size` bytes; `None`
    /// for an empty part, which has no byte to name.
    pub fn content_range(&self, size: u64) -> Option<String> {
        (!self.span.is_empty())
            .then(|| format!("bytes {}-{}/{size}", self.span.start, self.span.end - 1))
    }
}

/// The part number `number` if S3 allows it (1 to 10,000): uploads and
/// reads share the rule.
pub(crate) fn check_part_number(number: i32) -> S3Result<u32> {
    match u32::try_from(number) {
        Ok(n) if (1..=MAX_PART_NUMBER).contains(&n) => Ok(n),
        _ => Err(s3(
            S3ErrorCode::InvalidArgument,
            format!("part number {number} is not between 1 and {MAX_PART_NUMBER}"),
        )),
    }
}

/// The part `number` of `bucket/key`, opened as `opened` with `meta`; a
/// Range given with it is refused, as S3 refuses it.
pub(crate) async fn part_span(
    client: &Client,
    opened: &Opened,
    meta: &ObjectMeta,
    (bucket, key): (&str, &str),
    number: i32,
    with_range: bool,
) -> S3Result<PartSpan> {
    if with_range {
        return Err(s3(
            S3ErrorCode::InvalidRequest,
            "a Range and a partNumber cannot be asked together: ask for one of them",
        ));
    }
    let number = check_part_number(number)?;
    // (number, size, checksum) of each part, in the object's order: an
    // object stored in one piece is its own part 1.
    let parts: Vec<(u32, u64, Option<String>)> = match &meta.multipart {
        None => vec![(
            1,
            meta.size,
            meta.checksum.as_ref().map(|kept| kept.value.clone()),
        )],
        Some(_) => read_manifest(client, opened)
            .await
            .map_err(|e| from_store(&format!("reading the parts of '{bucket}/{key}'"), &e))?
            .parts
            .into_iter()
            .map(|part| (part.number, part.size, part.checksum))
            .collect(),
    };
    let sizes: Vec<(u32, u64)> = parts.iter().map(|(n, size, _)| (*n, *size)).collect();
    let mut span =
        span_of(&sizes, number).ok_or_else(|| not_a_part(bucket, key, number, sizes.len()))?;
    let own = parts.into_iter().find(|(n, _, _)| *n == number);
    span.checksum = match (&meta.checksum, own) {
        (Some(kept), Some((_, _, Some(value)))) => Some(KeptChecksum {
            algorithm: kept.algorithm,
            value,
            full_object: false,
        }),
        _ => None,
    };
    Ok(span)
}

/// Where part `number` lies among parts of `(number, size)`, in order.
fn span_of(sizes: &[(u32, u64)], number: u32) -> Option<PartSpan> {
    let mut start = 0u64;
    for &(this, size) in sizes {
        let end = start.checked_add(size)?;
        if this == number {
            return Some(PartSpan {
                span: start..end,
                parts: u32::try_from(sizes.len()).ok()?,
                checksum: None,
            });
        }
        start = end;
    }
    None
}

/// S3's answer to a part number the object does not have: 416
/// InvalidPartNumber.
fn not_a_part(bucket: &str, key: &str, number: u32, parts: usize) -> S3Error {
    let mut error = s3(
        S3ErrorCode::Custom("InvalidPartNumber".into()),
        format!("'{bucket}/{key}' has no part {number}: it has {parts} part(s)"),
    );
    error.set_status_code(hyper::StatusCode::RANGE_NOT_SATISFIABLE);
    error
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_lie_end_to_end_in_their_manifest_order() {
        let sizes = [(1, 5 << 20), (3, 5 << 20), (7, 10)];
        let third = span_of(&sizes, 7).unwrap();
        assert_eq!(third.span, (10 << 20)..(10 << 20) + 10);
        assert_eq!(third.parts, 3);
        assert_eq!(
            third.content_range(third.span.end).unwrap(),
            format!("bytes {}-{}/{}", 10 << 20, (10 << 20) + 9, (10 << 20) + 10)
        );
        assert_eq!(span_of(&sizes, 3).unwrap().span, (5 << 20)..(10 << 20));
        assert!(span_of(&sizes, 2).is_none(), "a number not uploaded");
        let empty = span_of(&[(1, 0)], 1).unwrap();
        assert_eq!(empty.content_range(0), None);
    }
}
